"""Reading distributed's own logs: what they hold since the last look.

distributed keeps capped deques of recent happenings (a worker's
``transfer_outgoing_log`` of the data it sent); Crux reads them instead of
wrapping what logs them.  Only the standard library: workers load
this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["since"]


def since(log: Sequence[Any], seen: Any) -> tuple[list[Any], bool]:
    """The entries of ``log`` after ``seen`` (the newest one read before), oldest first,
    and whether some were lost: ``seen`` fell out of the capped log before what
    followed it was read (never when ``seen`` is None, nothing read yet).

    Searched from the newest, entry by identity: a look when nothing was logged
    since costs one comparison.
    """
    if not log or log[-1] is seen:
        return [], False
    fresh = []
    for entry in reversed(log):
        if entry is seen:
            break
        fresh.append(entry)
    else:
        fresh.reverse()
        return fresh, seen is not None
    fresh.reverse()
    return fresh, False

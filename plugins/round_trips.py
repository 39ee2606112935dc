"""A worker's round trips to the scheduler, timed to read the scheduler's clock.

Times a worker records are in the scheduler's clock, as this worker estimates
it from the round trips of its sends (:mod:`crux_dask.plugins.clock`), not from
distributed's latest heartbeat.  :class:`ClockRoundTrips` times a few empty
round trips as the worker starts (:data:`CLOCK_PROBES`), so that what it
records before its first batch is in a bounded estimate, and then the round
trip of each batch sent (:mod:`crux_dask.plugins.batches`): each answer carries
the scheduler's clock.  Times distributed converted itself (a task's start and
stop, a transfer's) are converted back with the offset it used, and again with
this estimate, where they are read.
"""

from __future__ import annotations

import logging
from time import time
from typing import TYPE_CHECKING, Any

from crux_dask.plugins.clock import ClockOffset
from crux_dask.plugins.protocol import EVENTS_HANDLER

if TYPE_CHECKING:
    from distributed import Worker

__all__ = ["CLOCK_PROBES", "ClockRoundTrips"]

#: The worker plugin's messages, under one name wherever they are logged from.
logger = logging.getLogger("crux_dask.plugins.worker")

#: Empty round trips a worker times as it starts, so that what it records before its
#: first batch is in a bounded estimate of the scheduler's clock (the first one may
#: open a connection: the others bound it tighter).
CLOCK_PROBES = 3


class ClockRoundTrips:
    """The scheduler's clock as a worker's plugin reads it (a mixin of the plugin).

    Attributes
    ----------
    clock : ClockOffset
        The estimate, from the round trips timed so far.
    offset : float
        ``clock.offset``, in an attribute of its own: every hook reads it.
    """

    worker: Worker
    clock: ClockOffset
    offset: float

    def _start_clock(self, worker: Worker) -> None:
        """Start from distributed's estimate, until a round trip bounds it better."""
        self.clock = ClockOffset(worker.scheduler_delay)
        self.offset = self.clock.offset  # read by every hook: one attribute

    async def _probe_clock(self) -> None:
        """Time :data:`CLOCK_PROBES` empty round trips to the scheduler; give up on the
        first that fails (the first batch's round trip will do)."""
        try:
            send = getattr(self.worker.scheduler, EVENTS_HANDLER)
            for _ in range(CLOCK_PROBES):
                sent = time()
                self._timed(sent, await send(source=self.worker.address))
        except Exception as error:
            logger.debug("Crux could not time a round trip to the scheduler: %r", error)

    def _timed(self, sent: float, reply: Any) -> None:
        """A round trip sent at ``sent`` is over: its answer's clock (``time``) may
        bound the scheduler's better (:class:`~crux_dask.plugins.clock.ClockOffset`)."""
        clock = reply.get("time") if isinstance(reply, dict) else None
        if isinstance(clock, float) and self.clock.sample(sent, time(), clock):
            self.offset = self.clock.offset

    def _now(self) -> float:
        """Now, in the scheduler's clock."""
        return time() + self.offset

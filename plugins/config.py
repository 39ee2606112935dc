"""The ``crux-dask`` configuration namespace: defaults, schema and typed access."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

import crux_dask

_PACKAGE = pathlib.Path(crux_dask.__file__).parent
DEFAULTS_PATH = _PACKAGE / "crux-dask.yaml"
SCHEMA_PATH = _PACKAGE / "crux-dask-schema.yaml"

with DEFAULTS_PATH.open() as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def get(name: str, value: Any = None) -> Any:
    """``value`` if given, else the configured ``crux-dask.<name>``.

    Falls back to the package default when the key is missing, as it is in a
    configuration that was reset after this module was imported.
    """
    if value is not None:
        return value
    default: Any = defaults["crux-dask"]
    for part in name.split("."):
        default = default[part]
    return dask.config.get(f"crux-dask.{name}", default=default)


def seconds(name: str, value: Any = None) -> float:
    """A configured time in seconds (``"100ms"``, ``"5s"`` or a number).

    Raises
    ------
    ValueError
        If the value is not a positive time.
    """
    raw = get(name, value)
    try:
        result = parse_timedelta(raw, default="s")
    except (ValueError, TypeError, KeyError):
        result = None
    if result is None or not result > 0:
        raise ValueError(f"crux-dask.{name} must be a positive time such as '100ms', "
                         f"got {raw!r}")
    return float(result)


def optional_seconds(name: str, value: Any = None) -> float | None:
    """Like :func:`seconds`; ``None`` where the configuration says ``null``."""
    return None if get(name, value) is None else seconds(name, value)


def patterns(name: str) -> tuple[str, ...]:
    """A configured list of glob patterns.

    Raises
    ------
    ValueError
        If the value is not a list of strings.
    """
    raw = get(name)
    if not isinstance(raw, (list, tuple)) or not all(isinstance(p, str) for p in raw):
        raise ValueError(f"crux-dask.{name} must be a list of glob patterns, got {raw!r}")
    return tuple(raw)


def positive_int(name: str, value: Any = None) -> int:
    """A configured positive integer.

    Raises
    ------
    ValueError
        If the value is not a positive integer.
    """
    raw = get(name, value)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"crux-dask.{name} must be a positive integer, got {raw!r}")
    return raw


@dataclass(frozen=True)
class Settings:
    """What the scheduler plugin runs with: its ``crux-dask`` keys, read once and checked.

    Each field is the key of the same name (``apply_interval`` is
    ``crux-dask.apply-interval``; ``http_token`` and ``http_max_body`` are
    ``http.token`` and ``http.max-body-bytes``; ``record_transitions`` is
    ``capture.transitions``), times in seconds.
    """

    apply_interval: float
    max_pending_events: int
    park_timeout: float
    max_transitions: int
    max_states: int | None
    spool_dir: str | None
    graph_process: bool
    record_transitions: bool
    http_token: str | None
    http_max_body: int

    @classmethod
    def read(cls, apply_interval: str | float | None = None,
             max_pending_events: int | None = None, park_timeout: str | float | None = None,
             max_transitions: int | None = None) -> Settings:
        """The configured settings; those given here (not ``None``) override theirs.

        Raises
        ------
        ValueError
            Naming the key whose value is not valid.
        """
        token = get("http.token")
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            raise ValueError("crux-dask.http.token must be a string of at least 8 characters")
        max_states = get("max-states")
        if max_states is not None and (isinstance(max_states, bool)
                                       or not isinstance(max_states, int) or max_states < 100):
            raise ValueError("crux-dask.max-states must be null or an integer of at least 100, "
                             f"got {max_states!r}")
        graph_process = get("graph-process")
        if not isinstance(graph_process, bool):
            raise ValueError(f"crux-dask.graph-process must be true or false, "
                             f"got {graph_process!r}")
        return cls(apply_interval=seconds("apply-interval", apply_interval),
                   max_pending_events=positive_int("max-pending-events", max_pending_events),
                   park_timeout=seconds("park-timeout", park_timeout),
                   max_transitions=positive_int("max-transitions", max_transitions),
                   max_states=max_states, spool_dir=get("spool-dir"),
                   graph_process=graph_process,
                   record_transitions=bool(get("capture.transitions")), http_token=token,
                   http_max_body=positive_int("http.max-body-bytes"))

"""The ``crux-dask`` configuration namespace: defaults, schema and typed access."""

from __future__ import annotations

import pathlib
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

"""Workloads several test modules run."""

from __future__ import annotations

import dask
from dask.delayed import Delayed
from distributed.utils_test import inc


def chain(n: int) -> Delayed:
    """``step-0`` to ``step-{n-1}``, each the one before plus one (computes to ``n``): a
    pipeline whose steps are released as it goes."""
    step = 0
    for i in range(n):
        step = dask.delayed(inc)(step, dask_key_name=f"step-{i}")
    return step

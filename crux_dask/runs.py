"""A recorded run as the what-if replay reads it: its tasks, their inputs and seconds, and
the scheduling gaps measured in it (made by :func:`crux_dask.recording.extract`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from crux_dask.store import PAGStore

__all__ = ["Gaps", "Run"]


@dataclass
class Gaps:
    """Seconds between what released a task and its next step, medians of the run.

    Where the run recorded when each worker received its tasks, the scheduler's
    part (release to arrival at the worker) and the worker's part (inputs there
    and a thread free to the start) are measured apart; without that moment,
    the whole interval counts as the scheduler's part.

    Attributes
    ----------
    first : float
        Graph root to a task without inputs reaching its worker.
    local : float
        A task's last input computed to the task reaching its worker (the
        scheduler's round trip).
    slot : float
        A queue slot freed to the root task it released reaching its worker.
    fetch : float
        A task reaching its worker to the start of fetching an input held
        elsewhere.
    dispatch : float
        A task at its worker with its inputs there and a thread free, to its
        start.
    """

    first: float = 0.0
    local: float = 0.0
    slot: float = 0.0
    fetch: float = 0.0
    dispatch: float = 0.0


@dataclass
class Run:
    """A recorded run reduced to what the replay needs; tasks in priority order.

    A task's index is its rank: Dask's priority where the run recorded every
    task's, else its recorded start.

    Attributes
    ----------
    store : PAGStore
        The recorded graph.
    state : numpy.ndarray
        The state each task computed.
    duration : numpy.ndarray
        Compute seconds of each task.
    spill : numpy.ndarray
        Seconds of spilling charged to each task.
    size : numpy.ndarray
        Bytes of each task's output.
    label : numpy.ndarray
        Label code of each task (``store.labels``).
    worker : numpy.ndarray
        Index of the worker each task ran on (into ``workers``).
    dep_ptr, deps : numpy.ndarray
        Input tasks of each task, as compressed rows.
    workers : list of str
        Addresses of the workers that ran tasks.
    threads : int
        Threads per worker seen (the most distinct threads of any worker).
    gaps : Gaps
    latency, bandwidth : float
        Of transfers between workers: seconds, and bytes per second.
    outputs : numpy.ndarray
        Tasks whose results went to the client, with ``output_delay``: seconds
        from the last of them computed to each one's arrival there.
    output_delay : numpy.ndarray
    origin : float
        Time of the graph's root.
    makespan : float
        Seconds from ``origin`` to the run's end state.
    """

    store: PAGStore
    state: np.ndarray
    duration: np.ndarray
    spill: np.ndarray
    size: np.ndarray
    label: np.ndarray
    worker: np.ndarray
    dep_ptr: np.ndarray
    deps: np.ndarray
    workers: list[str]
    threads: int
    gaps: Gaps
    latency: float
    bandwidth: float
    outputs: np.ndarray
    output_delay: np.ndarray
    origin: float
    makespan: float
    #: What the what-if computed of the run once, for the next change.
    memo: dict = field(default_factory=dict, repr=False)

    @property
    def n_tasks(self) -> int:
        return len(self.state)

    @cached_property
    def label_names(self) -> np.ndarray:
        """The label of each task, as strings."""
        return np.asarray(self.store.labels.values, dtype=object)[self.label]

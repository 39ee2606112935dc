"""The steps of a critical path, and the parts of each step's cost.

A step goes from one state to the next, through a data mutation or through a
cause (:class:`~crux_dask.model.CauseKind`: the thread or the queue slot
another task freed).  Its ``cost`` (the time between the two states) splits
into:

* the **busy** part: the operation that made the state (a computation, a
  transfer, a spill, file I/O), named by its category; the shards of a P2P
  shuffle are computed by its transfer tasks, and their sending (to the
  destination's memory or disk) is a transfer;
* **io**: of a computation, the seconds it spent on files (off the CPU after
  it opened its first file), where measured;
* **client**: of the time before a task's operation, the part before its
  graph reached the scheduler (data an earlier computation made, used by a
  later one: the client had not submitted the work yet); of the time before a
  client gathered data, the part after the scheduler saw its task finish
  (the scheduler telling the client, the client's request, its way to the
  worker);
* the stages of Dask's pipeline from the step's cause to the operation's
  start, where the task's moments were recorded, each between two of them:

  - **report**: the step's first state made on its worker → the scheduler
    learnt it (its transition of the task to memory ran): the worker's message;
  - **scheduler**: → the scheduler sent the task (for a fetch: → the worker
    asked for the data, which it does as the task arrives): the scheduler's
    queue and decision;
  - **dispatch**: sent → its worker received the task: the message;
  - **worker**: received → started: the worker's own queue and event loop,
    beyond what a thread or queue slot cause explains;
  - **scheduling**: where a moment between two stages was not recorded (a
    worker without Crux, a dataset of an older version), those stages together;
* **rescheduled**: for a task the scheduler took back from a worker
  and sent again (a task that raised ``Reschedule``, a P2P shuffle's output
  run once only to pin it to its worker, a task whose worker was lost), the
  time from its first sending to its last;
* **queued**: a fetch that waited, from when its worker asked for it to its
  start, for the worker's transfer capacity;
* **wait**: what no recorded interval explains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from crux_dask.model import SHARDS_LABEL, CauseKind, MutationKind, location_class
from crux_dask.store import PAGStore

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CATEGORIES", "PARTS", "STAGES", "steps_frame"]

#: Categories of the breakdown, in display order.
CATEGORIES = ("compute", "transfer", "spill", "io", "delete", "client", "report", "scheduler",
              "rescheduled", "dispatch", "worker", "scheduling", "queued", "wait")
#: The stages of Dask's pipeline a step's gap splits into, in time order.
STAGES = ("report", "scheduler", "rescheduled", "dispatch", "worker")
#: The parts of a step's cost besides its busy part, each a category of its own.
PARTS = ("io", "client", *STAGES, "scheduling", "queued", "wait")
_KIND_NAMES = np.array([k.name for k in (*MutationKind, *CauseKind)], object)
_VIA = np.array([k.name.lower() for k in CauseKind], object)


def steps_frame(store: PAGStore, through_cause: np.ndarray, ids: np.ndarray, src: np.ndarray,
           dst: np.ndarray, states: pd.DataFrame) -> pd.DataFrame:
    """One row per step of a path: the frame of :meth:`CriticalPath.to_frame`.

    Parameters
    ----------
    store : PAGStore
    through_cause : numpy.ndarray
        Whether each step came through a cause (else through a mutation).
    ids : numpy.ndarray
        The id of each step's cause or mutation.
    src, dst : numpy.ndarray
        The state each step goes from, and the state it goes to.
    states : pandas.DataFrame
        The path's states, first to last (one more than its steps).
    """
    import pandas as pd
    n = len(ids)
    time = store.column("state_time", np.concatenate([src, dst]))
    src_time, stop = time[:n], time[n:]
    start = store.column("state_start", dst)
    kind_code = _kind_codes(store, through_cause, ids)
    category, gathered = _categories(store, through_cause, kind_code, src, dst,
                                     states["label"].iloc[1:].to_numpy())
    return pd.DataFrame({
        "step": np.arange(n),
        "via": pd.Series(np.where(through_cause,
                                  _VIA[np.maximum(kind_code - len(MutationKind), 0)], "data"),
                         dtype="str"),
        "mutation_id": np.where(through_cause, -1, ids),
        "cause_id": np.where(through_cause, ids, -1),
        "src": src,
        "dst": dst,
        "kind": pd.Series(_KIND_NAMES[kind_code], dtype="str"),
        "category": pd.Series(category, dtype="str"),
        "key": states["key"].iloc[1:].reset_index(drop=True),
        "label": states["label"].iloc[1:].reset_index(drop=True),
        "source": states["location"].iloc[:-1].reset_index(drop=True),
        "destination": states["location"].iloc[1:].reset_index(drop=True),
        "size": states["size"].iloc[1:].reset_index(drop=True),
        "start": start,
        "stop": stop,
        **_cost_parts(store, through_cause, ids, src, dst, src_time, start, stop, category,
                      gathered, kind_code == len(MutationKind) + CauseKind.THREAD),
    })


def _kind_codes(store: PAGStore, through_cause: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each step's kind, as an index into :data:`_KIND_NAMES`.

    A mutation's kind is its :class:`~crux_dask.model.MutationKind`; a cause's,
    its :class:`~crux_dask.model.CauseKind` after all the mutation kinds.
    """
    kind_code = np.empty(len(ids), np.int64)
    kind_code[~through_cause] = store.column("mutation_kind", ids[~through_cause])
    kind_code[through_cause] = len(MutationKind) + store.column("cause_kind", ids[through_cause])
    return kind_code


def _categories(store: PAGStore, through_cause: np.ndarray, kind_code: np.ndarray,
                src: np.ndarray, dst: np.ndarray, labels: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The category of each step's busy part, and which steps are gathers.

    Parameters
    ----------
    store : PAGStore
    through_cause, kind_code : numpy.ndarray
        Whether each step came through a cause, and its kind (:func:`_kind_codes`).
    src, dst : numpy.ndarray
        The state each step goes from, and the state it goes to.
    labels : numpy.ndarray
        The label of each step's ``dst``.

    Returns
    -------
    category : numpy.ndarray
        ``delete`` for a deletion; for a transfer ``transfer``, ``io`` (to or
        from a file) or ``spill`` (to or from a disk), a P2P shuffle's shards
        being a transfer; else ``compute`` (a cause step's target is a task's).
    gathered : numpy.ndarray
        Whether each step is a transfer to the client.
    """
    classes = np.array([location_class(v) for v in store.locations.values] or [""], object)
    src_class = classes[store.column("state_location", src)]
    dst_class = classes[store.column("state_location", dst)]
    moved = ~through_cause & (kind_code == MutationKind.TRANSFER)
    category = np.where(~through_cause & (kind_code == MutationKind.DELETE), "delete",
                        "compute").astype(object)
    category[moved] = "transfer"
    category[moved & ((src_class == "file") | (dst_class == "file"))] = "io"
    category[moved & ((src_class == "disk") | (dst_class == "disk"))] = "spill"
    category[moved & (labels == SHARDS_LABEL)] = "transfer"
    return category, moved & (dst_class == "client")


def _cost_parts(store: PAGStore, through_cause: np.ndarray, ids: np.ndarray, src: np.ndarray,
                dst: np.ndarray, src_time: np.ndarray, start: np.ndarray, stop: np.ndarray,
                category: np.ndarray, gathered: np.ndarray, via_thread: np.ndarray
                ) -> dict[str, np.ndarray]:
    """Each step's ``cost`` and its parts: ``busy``, ``io`` and the gap's (:func:`_gap_parts`).

    Parameters
    ----------
    store : PAGStore
    through_cause, ids : numpy.ndarray
        Whether each step came through a cause, and the id of its cause or mutation.
    src, dst : numpy.ndarray
        The state each step goes from, and the state it goes to.
    src_time, start, stop : numpy.ndarray
        When each step's first state was made, and when its operation started
        and stopped.
    category, gathered : numpy.ndarray
        The category of each step's busy part, and whether it is a gather
        (:func:`_categories`).
    via_thread : numpy.ndarray
        Whether each step came through a thread its worker freed.
    """
    cost = stop - src_time
    busy = np.zeros(len(ids))
    busy[~through_cause] = store.column("mutation_busy", ids[~through_cause])
    busy[through_cause] = stop[through_cause] - start[through_cause]
    busy = np.minimum(np.maximum(busy, 0.0), np.maximum(cost, 0.0))
    gap = cost - busy
    # A computation's seconds on files are io, not compute.
    io = np.where(category == "compute", np.minimum(
        np.nan_to_num(store.column("state_io", dst)).clip(0.0), busy), 0.0)
    busy -= io
    is_fetch = (category == "transfer") & ~gathered
    # When the scheduler learnt the step's first state was made; not of a freed
    # thread, which the worker hands on by itself.  A task's state (its moments
    # recorded) without it: the announcement went unrecorded.  A copy a fetch made
    # has none to record: the scheduler learns of it from the fetching worker, and
    # need not have before it sends the task that uses it.
    announced = np.where(via_thread, np.nan, store.column("state_announced", src))
    untold = (~via_thread & np.isnan(announced) & ~_copies(store, src)
              & ~np.isnan(store.column("state_requested", src)))
    return {"cost": cost, "busy": busy, "io": io,
            **_gap_parts(store, dst, gap, src_time, announced, untold, is_fetch, gathered)}


def _copies(store: PAGStore, states: np.ndarray) -> np.ndarray:
    """Whether each of ``states`` is a copy of its key's data: made by a ``TRANSFER``."""
    pred = store.column("state_pred", states)
    made = np.full(len(states), -1, np.int64)
    made[pred >= 0] = store.column("mutation_kind", pred[pred >= 0])
    return made == MutationKind.TRANSFER


def _gap_parts(store: PAGStore, dst: np.ndarray, gap: np.ndarray, src_time: np.ndarray,
               announced: np.ndarray, untold: np.ndarray, is_fetch: np.ndarray,
               gathered: np.ndarray) -> dict[str, np.ndarray]:
    """The parts of each step's gap (its cost outside its operation): see the module's
    description.

    Only the gap of a step whose ``requested`` moment was recorded is
    explained, as a chain of intervals between recorded moments from its
    first state to its operation's start: ``client`` (before the graph was
    submitted), the :data:`STAGES`, then ``queued`` for a fetch and
    ``client`` for a gather.  Each moment is clipped into the interval the
    ones before it leave.  The rest of the gap, and a negative gap (clocks
    that disagree), is ``wait``.

    Parameters
    ----------
    store : PAGStore
    dst : numpy.ndarray
        The state each step goes to.
    gap : numpy.ndarray
        Seconds of each step's cost outside its busy part and io.
    src_time : numpy.ndarray
        When each step's first state was made.
    announced, untold : numpy.ndarray
        When the scheduler learnt that, where it counts (NaN elsewhere), and
        whether it was not recorded though it counts: the step's ``report``
        and ``scheduler`` stages are then ``scheduling`` together.
    is_fetch, gathered : numpy.ndarray
        Whether each step is a transfer between workers, or to the client.
    """
    moment = {name: store.column(f"state_{name}", dst)
              for name in ("requested", "received", "submitted", "first_requested")}
    recorded = ~np.isnan(moment["requested"])
    end = src_time + np.where(recorded, np.maximum(gap, 0.0), 0.0)
    parts = _chained(moment, _Chain(src_time, end), announced, is_fetch, gathered)
    untold = recorded & untold & ~gathered
    parts["scheduling"] += np.where(untold, parts["scheduler"], 0.0)
    parts["scheduler"] = np.where(untold, 0.0, parts["scheduler"])
    parts["wait"] = gap - sum(parts.values())
    return parts


def _chained(moment: dict[str, np.ndarray], chain: _Chain, announced: np.ndarray,
             is_fetch: np.ndarray, gathered: np.ndarray) -> dict[str, np.ndarray]:
    """The intervals of each step's gap from its first state to its operation's start,
    one after the other (:func:`_gap_parts`), its ``moment`` columns by name."""
    task = ~is_fetch & ~gathered
    parts = {
        # Before the graph reached the scheduler, nothing could schedule the operation.
        "client": chain.to(np.where(task, moment["submitted"], np.nan)),
        # A gather's request is the scheduler's announcement, where the client's
        # copy came from elsewhere than the task's worker.
        "report": chain.to(np.where(gathered & np.isnan(announced), moment["requested"],
                                    announced)),
        "scheduler": chain.to(np.where(task, np.fmin(moment["first_requested"],
                                                     moment["requested"]),
                                       np.where(is_fetch, moment["requested"], np.nan))),
        "rescheduled": chain.to(np.where(task, moment["requested"], np.nan)),
        "dispatch": chain.to(np.where(task, moment["received"], np.nan)),
    }
    # The rest: a task's worker once it had the task; a fetch waiting for its worker's
    # transfer capacity; a gather, the client told its data was ready and fetching it;
    # where the task's arrival was not recorded, every stage after its sending.
    rest = chain.end - chain.at
    arrived = task & ~np.isnan(moment["received"])
    parts["worker"] = np.where(arrived, rest, 0.0)
    parts["scheduling"] = np.where(task & ~arrived, rest, 0.0)
    parts["queued"] = np.where(is_fetch, rest, 0.0)
    parts["client"] = parts["client"] + np.where(gathered, rest, 0.0)
    return parts


class _Chain:
    """Intervals one after the other, from ``at`` (each step's) to at most ``end``."""

    def __init__(self, at: np.ndarray, end: np.ndarray) -> None:
        self.at, self.end = at.copy(), end

    def to(self, moment: np.ndarray) -> np.ndarray:
        """Seconds from where the chain is to ``moment`` (clipped into what is left);
        none where it is NaN.  The chain then goes on from there."""
        reached = np.where(np.isnan(moment), self.at, np.clip(moment, self.at, self.end))
        seconds = reached - self.at
        self.at = reached
        return seconds

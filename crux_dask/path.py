"""A critical path as users see it: its states, its steps, and where its time went.

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

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.model import SHARDS_LABEL, CauseKind, MutationKind, location_class
from crux_dask.store import PAGStore

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CATEGORIES", "NO_STEPS", "PARTS", "STAGES", "CriticalPath", "Steps"]

#: Categories of the breakdown, in display order.
CATEGORIES = ("compute", "transfer", "spill", "io", "delete", "client", "report", "scheduler",
              "rescheduled", "dispatch", "worker", "scheduling", "queued", "wait")
#: The stages of Dask's pipeline a step's gap splits into, in time order.
STAGES = ("report", "scheduler", "rescheduled", "dispatch", "worker")
#: The parts of a step's cost besides its busy part, each a category of its own.
PARTS = ("io", "client", *STAGES, "scheduling", "queued", "wait")
#: The steps of a path, in order: whether each came through a cause, and the id
#: of its cause or mutation.
Steps = tuple[np.ndarray, np.ndarray]
NO_STEPS: Steps = (np.zeros(0, bool), np.zeros(0, np.int64))


@dataclass
class CriticalPath:
    """A critical path: ordered states and the steps between them.

    Attributes
    ----------
    states : pandas.DataFrame
        The states along the path, first to last (data-state columns).
    steps : pandas.DataFrame
        One row per step, in order: see :meth:`to_frame`.
    method : str
        ``"observed"`` or ``"longest"``.
    length : float
        Seconds from the first state to the last.
    breakdown : dict
        Seconds of the path by category (:data:`CATEGORIES`); they add up to
        ``length``.
    """

    states: pd.DataFrame
    steps: pd.DataFrame
    method: str
    length: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_store(cls, store: PAGStore, steps: Steps, method: str,
                   single: int | None = None) -> CriticalPath:
        """The path of ``steps`` in ``store`` (just the state ``single`` when empty)."""
        through_cause, ids = steps
        mids, cids = ids[~through_cause], ids[through_cause]
        src = np.empty(len(ids), np.int64)
        dst = np.empty(len(ids), np.int64)
        src[~through_cause] = store.column("mutation_src", mids)
        dst[~through_cause] = store.column("mutation_dst", mids)
        src[through_cause] = store.column("cause_src", cids)
        dst[through_cause] = store.column("cause_dst", cids)
        if len(ids):
            sids = np.concatenate([src[:1], dst])
        else:
            sids = np.asarray([] if single is None or single < 0 else [single], "int64")
        states = store.states_frame(sids).reset_index(drop=True)
        frame = _steps(store, through_cause, ids, src, dst, states)
        length = float(states["time"].iloc[-1] - states["time"].iloc[0]) if len(states) else 0.0
        return cls(states, frame, method, length, _breakdown(frame))

    def clipped(self, start: float) -> CriticalPath:
        """The path from the time ``start`` on (the same path if it starts later).

        The part of the first step before ``start`` is taken off, earliest
        part first: its ``wait``, ``client``, the stages in order,
        ``scheduling``, ``queued``, ``io``, then its busy part.  The states are kept;
        :attr:`length` and :attr:`breakdown` count from ``start``.
        """
        if not len(self.states) or self.states["time"].iloc[0] >= start:
            return self
        end = float(self.states["time"].iloc[-1])
        cut = min(start, end) - float(self.states["time"].iloc[0])
        steps = self.steps.copy()
        steps.loc[0, "cost"] -= cut
        for part in ("wait", "client", *STAGES, "scheduling", "queued", "io", "busy"):
            taken = min(cut, max(float(steps.loc[0, part]), 0.0))
            steps.loc[0, part] -= taken
            cut -= taken
        steps.loc[0, "wait"] -= cut  # what clocks that disagree leave
        return CriticalPath(self.states, steps, self.method, end - min(start, end),
                            _breakdown(steps))

    def __len__(self) -> int:
        return len(self.steps)

    def to_frame(self) -> pd.DataFrame:
        """One row per step (shared: treat it as read-only).

        Columns: ``step``; ``via`` (``data``, ``thread`` or ``slot``: what
        released the step); ``mutation_id`` or ``cause_id`` (``-1`` for the
        other); ``src`` and ``dst`` states; ``kind`` (the mutation's kind, or
        the cause's); ``category`` of the busy part; ``key``, ``label``,
        ``source`` and ``destination`` locations, ``size``; ``start`` and
        ``stop`` of the operation; ``cost``
        and its parts ``busy`` and :data:`PARTS`.
        """
        return self.steps

    def by_prefix(self) -> pd.DataFrame:
        """Where the path spends its time, by task prefix (the label of what each step made).

        One row per prefix, most seconds first: ``prefix``, ``seconds`` on the
        path (the cost of its steps), ``share`` of the path's length,
        ``steps``, and the ``dominant`` category of those seconds (a busy
        category or one of :data:`PARTS`).
        """
        import pandas as pd
        steps = self.steps
        prefix = steps["label"]
        seconds = pd.concat([  # every second of a step under its category
            pd.DataFrame({"prefix": prefix, "category": steps["category"],
                          "seconds": steps["busy"]}),
            *(pd.DataFrame({"prefix": prefix, "category": part, "seconds": steps[part]})
              for part in PARTS)])
        by = seconds.pivot_table(index="prefix", columns="category", values="seconds",
                                 aggfunc="sum", fill_value=0.0)
        table = pd.DataFrame({
            "prefix": pd.Series(by.index, dtype="str"),
            "seconds": by.sum(axis=1).to_numpy(),
            "steps": prefix.value_counts().reindex(by.index).to_numpy(dtype="int64"),
            "dominant": pd.Series(by.idxmax(axis=1).to_numpy() if len(by) else [],
                                  dtype="str"),
        })
        table.insert(2, "share", table["seconds"] / self.length if self.length > 0 else 0.0)
        return table.sort_values("seconds", ascending=False, kind="stable").reset_index(
            drop=True)

    def summary(self) -> str:
        """A few lines of text: length, steps and the breakdown."""
        lines = [f"Workflow critical path ({self.method}): {self.length:.3f} s "
                 f"in {len(self)} steps"]
        for category, seconds in self.breakdown.items():
            share = seconds / self.length if self.length > 0 else 0.0
            lines.append(f"  {category:<11} {seconds:9.3f} s  {share:6.1%}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{v:.3f} s</td></tr>"
            for k, v in self.breakdown.items()
        )
        table = self.to_frame().to_html(index=False, max_rows=50)
        return (
            f"<div><strong>Workflow critical path ({html.escape(self.method)})</strong>: "
            f"{self.length:.3f} s in {len(self)} steps"
            f"<table><tr><th>category</th><th>seconds</th></tr>{rows}</table>{table}</div>"
        )


_KIND_NAMES = np.array([k.name for k in (*MutationKind, *CauseKind)], object)
_VIA = np.array([k.name.lower() for k in CauseKind], object)


def _breakdown(steps: pd.DataFrame) -> dict[str, float]:
    """Seconds of the steps by category: busy parts by their category, and the gaps."""
    busy = steps.groupby("category", observed=True)["busy"].sum()
    breakdown = {c: float(busy.get(c, 0.0)) for c in CATEGORIES}
    for part in PARTS:
        breakdown[part] += float(steps[part].sum())
    return breakdown


def _steps(store: PAGStore, through_cause: np.ndarray, ids: np.ndarray, src: np.ndarray,
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
    # recorded) without it: the announcement went unrecorded.
    announced = np.where(via_thread, np.nan, store.column("state_announced", src))
    untold = ~via_thread & np.isnan(announced) & ~np.isnan(store.column("state_requested",
                                                                          src))
    return {"cost": cost, "busy": busy, "io": io,
            **_gap_parts(store, dst, gap, src_time, announced, untold, is_fetch, gathered)}


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
    chain = _Chain(src_time, end)
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
    rest = end - chain.at
    arrived = task & ~np.isnan(moment["received"])
    parts["worker"] = np.where(arrived, rest, 0.0)
    parts["scheduling"] = np.where(task & ~arrived, rest, 0.0)
    parts["queued"] = np.where(is_fetch, rest, 0.0)
    parts["client"] = parts["client"] + np.where(gathered, rest, 0.0)
    untold = recorded & untold & ~gathered
    parts["scheduling"] += np.where(untold, parts["scheduler"], 0.0)
    parts["scheduler"] = np.where(untold, 0.0, parts["scheduler"])
    parts["wait"] = gap - sum(parts.values())
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

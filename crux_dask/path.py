"""A critical path as users see it: its states, its steps, and where its time went.

A step goes from one state to the next, through a data mutation or through a
cause (:class:`~crux_dask.model.CauseKind`: the thread or the queue slot
another task freed); the parts its cost splits into are those of
:mod:`crux_dask.costs`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.costs import CATEGORIES, PARTS, STAGES, steps_frame
from crux_dask.groups import FLOOR, describe_straggler, flag_steps, straggler_kinds
from crux_dask.store import PAGStore

# pandas is imported where frames are made: a scheduler loads this module as it
# starts, and importing pandas takes a quarter of a second.
if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CATEGORIES", "NO_STEPS", "PARTS", "STAGES", "CriticalPath", "Steps"]

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
        frame = flag_steps(store, steps_frame(store, through_cause, ids, src, dst, states))
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
        and its parts ``busy`` and :data:`PARTS`; and of the task the step
        made, its ``group``, ``slowdown``, ``bytes_ratio`` and whether it is a
        ``straggler`` (:func:`~crux_dask.groups.flag_steps`).
        """
        return self.steps

    def by_prefix(self) -> pd.DataFrame:
        """Where the path spends its time, by task prefix (the label of what each step made).

        One row per prefix, most seconds first: ``prefix``, ``seconds`` on the
        path (the cost of its steps), ``share`` of the path's length,
        ``steps``, the ``dominant`` category of those seconds (a busy
        category or one of :data:`PARTS`), and how many of its steps made a
        ``stragglers`` (see :meth:`stragglers`).
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
            "stragglers": (steps["straggler"] != "").groupby(prefix).sum().reindex(
                by.index).to_numpy(dtype="int64"),
        })
        table.insert(2, "share", table["seconds"] / self.length if self.length > 0 else 0.0)
        return table.sort_values("seconds", ascending=False, kind="stable").reset_index(
            drop=True)

    def stragglers(self, floor: float = FLOOR) -> pd.DataFrame:
        """The steps that made a straggler (see :mod:`crux_dask.groups`) at least ``floor``
        seconds over its group's median, most of the path first.

        Columns: ``step``, ``key``, ``group``, ``destination`` (where it was
        computed), ``straggler`` (``skew``: its
        bytes explain it, or ``slow``), ``cost`` of the step and its ``share``
        of the path's length, ``slowdown`` (its task's seconds over its
        group's median) and ``bytes_ratio`` (its larger of input and output
        bytes over its group's medians).
        """
        steps = self.steps
        kinds = straggler_kinds(steps["slowdown"].to_numpy(), steps["median"].to_numpy(),
                                steps["bytes_ratio"].to_numpy(), floor)
        flagged = steps.assign(straggler=kinds).loc[kinds != "", [
            "step", "key", "group", "destination", "straggler", "cost", "slowdown",
            "bytes_ratio"]]
        flagged.insert(6, "share", flagged["cost"] / self.length if self.length > 0 else 0.0)
        return flagged.sort_values("cost", ascending=False, kind="stable").reset_index(
            drop=True)

    def summary(self) -> str:
        """A few lines of text: length, steps, the breakdown and the stragglers."""
        lines = [f"Workflow critical path ({self.method}): {self.length:.3f} s "
                 f"in {len(self)} steps"]
        for category, seconds in self.breakdown.items():
            share = seconds / self.length if self.length > 0 else 0.0
            lines.append(f"  {category:<11} {seconds:9.3f} s  {share:6.1%}")
        lines += [f"  straggler {describe_straggler(row)}"
                  for row in self.stragglers().itertuples(index=False)]
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


def _breakdown(steps: pd.DataFrame) -> dict[str, float]:
    """Seconds of the steps by category: busy parts by their category, and the gaps."""
    busy = steps.groupby("category", observed=True)["busy"].sum()
    breakdown = {c: float(busy.get(c, 0.0)) for c in CATEGORIES}
    for part in PARTS:
        breakdown[part] += float(steps[part].sum())
    return breakdown

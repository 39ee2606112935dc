"""Apply a window of events at once, with numpy, exactly as one by one.

Most events of a Dask run are routine: a task computed from inputs already in
its worker's memory, a fetch from a live copy, a release.  A routine event
creates exactly one state, so the id of every state a window of routine events
creates is known before any of them is applied: its position in the window,
after the last state.  Where each input comes from is then an *as-of join*:
the last event before it that wrote the same ``(key, location)`` slot or, if
none did, the slot as it stood before the window.  Everything else (mutation
kinds, the last-arriving input, ready times, key codes, what is held at the
end) follows with array operations.

:func:`apply_window` applies the longest prefix of routine events and stops
before the first event that is not: an annotated task, a task whose key is
already held somewhere, an input not known (the event would wait), a location
or task group never seen, a root, a malformed field.  The builder applies that
event on its scalar path and goes on.  The result is the same store and the
same builder state as applying the events one by one, which the tests check on
random event sequences.  A :class:`Window` is planned here and committed by
:mod:`crux_dask.graph.commit`.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.columns import COMPUTE, DELETE, OTHER, TRANSFER, EventColumns
from crux_dask.graph import arrays, rules
from crux_dask.graph.commit import commit

if TYPE_CHECKING:
    from crux_dask.graph.builder import PAGBuilder

__all__ = ["Window", "apply_window"]

_DEAD, _MISSING = arrays.DEAD, arrays.MISSING


def apply_window(builder: PAGBuilder, columns: EventColumns, lo: int, hi: int) -> int:
    """Apply the leading routine events of ``columns[lo:hi]``; return how many.

    Raises
    ------
    Exception
        Whatever a malformed window raises while it is planned; nothing is
        applied then, and the caller applies the events one by one.
    """
    window = Window(builder, columns, lo, hi)
    if window.n:
        commit(window)
    return window.n


class Window:
    """One window: planned in ``__init__`` (no side effects), applied by
    :func:`~crux_dask.graph.commit.commit`.

    The plan is made in steps, one method each, in the order ``__init__``
    calls them.  Each step computes one part of the plan for every candidate
    event (those before the first event of kind ``OTHER``) and marks in
    ``_scalar_only`` the events it must leave to the scalar path;
    :meth:`_take_prefix` then cuts every part to the ``n`` events before the
    first one marked, the events the window takes.  The parts of the plan
    that :func:`~crux_dask.graph.commit.commit` reads are public attributes;
    those only the steps share are private.
    """

    def __init__(self, builder: PAGBuilder, columns: EventColumns, lo: int, hi: int) -> None:
        self.builder = builder
        self.names = columns.strings
        at_c, at_t, at_d = self._split_by_kind(columns, lo, hi)
        c_key_index = self._find_keys(columns, lo, at_c)
        self._code_places(columns, at_c, at_t, at_d)
        self._code_labels(columns, at_c)
        self._check_keys_are_new(c_key_index)
        self._look_up_sources()
        self._check_shuffles()
        self._find_roots(columns, at_c)
        self._check_waited_for()
        self._take_prefix(columns, at_c, at_t, at_d)

    def _split_by_kind(self, columns: EventColumns, lo: int, hi: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Take the candidate events of ``columns[lo:hi]`` and split them by kind.

        Sets ``kinds``; the positions in the window of the computations,
        transfers and deletions (``ci``, ``ti``, ``di``); and
        ``_scalar_only``, with no event marked yet.  Returns their positions in
        ``columns``.
        """
        kinds = columns.kind[lo:hi]
        self.kinds = kinds = kinds[:arrays.first(kinds == OTHER, len(kinds))]
        ci, ti, di = (np.flatnonzero(kinds == kind) for kind in (COMPUTE, TRANSFER, DELETE))
        self.ci, self.ti, self.di = ci, ti, di
        self._scalar_only = np.zeros(len(kinds), bool)
        return lo + ci, lo + ti, lo + di

    def _find_keys(self, columns: EventColumns, lo: int, at_c: np.ndarray) -> np.ndarray:
        """Find the keys of the events and of the computations' inputs.

        A key is its index in the strings; ``at_c`` are the computations'
        positions in ``columns``.  Sets ``ev_key``; ``first_event``, the event
        of the window that first writes each key (``n`` for keys it does not
        write); ``_input_key``, the inputs' keys, and ``n_inputs``, how many
        each computation takes; and ``c_key``, the computations' keys as
        strings.  Returns the computations' keys as indices.
        """
        n, names = len(self.kinds), self.names
        self.ev_key = ev_key = columns.key[lo:lo + n]
        first_event = np.full(len(names), n, np.int64)
        np.minimum.at(first_event, ev_key, np.arange(n))
        self.first_event = first_event
        offset = columns.input_offset
        self._input_key = columns.inputs[offset[lo]:offset[lo + n]]
        self.n_inputs = columns.input_count[at_c]
        c_key_index = ev_key[self.ci]
        self.c_key = list(map(names.__getitem__, c_key_index.tolist()))
        return c_key_index

    def _code_places(self, columns: EventColumns, at_c: np.ndarray, at_t: np.ndarray,
                     at_d: np.ndarray) -> None:
        """Find the codes of the places the events name, and where each event writes.

        ``at_c``, ``at_t`` and ``at_d`` are the positions in ``columns`` of
        the computations, transfers and deletions.  Sets ``c["memory"]``, each
        computation's worker's memory, and ``t["source"]``, each transfer's
        source; ``ev_location``, where each event writes (the memory, a
        transfer's target, the place of a deletion); ``queued``, the
        computations queued for a slot of their worker, which the task
        ``released_by`` freed when it ended, and that task's key
        (``_releaser_key``) and its worker's memory (``_releaser_memory``, from
        ``released_on``).
        """
        builder, scalar_only = self.builder, self._scalar_only
        ci, ti, di = self.ci, self.ti, self.di
        memory, location = builder.places.memory.get, builder.store.locations.codes.get

        def location_codes(indices: np.ndarray) -> np.ndarray:
            return arrays.codes(columns, "location", builder, indices, location)

        c_memory = arrays.codes(columns, "memory", builder, columns.location[at_c], memory)
        released_by, released_on = columns.released_by[at_c], columns.released_on[at_c]
        self.queued = queued = np.flatnonzero(released_by >= 0)
        scalar_only[ci] |= (released_by >= 0) != (released_on >= 0)  # one without the other
        self._releaser_key = released_by[queued]
        self._releaser_memory = arrays.codes(columns, "memory", builder, released_on[queued],
                                             memory)
        scalar_only[ci[queued]] |= self._releaser_memory < 0
        t_source = location_codes(columns.source[at_t])
        t_target = location_codes(columns.location[at_t])
        d_location = location_codes(columns.location[at_d])
        scalar_only[ci] |= c_memory < 0
        scalar_only[ti] |= (t_source < 0) | (t_target < 0)
        scalar_only[ti] |= t_target == builder.places.root
        scalar_only[di] |= d_location < 0
        self.c, self.t = {"memory": c_memory}, {"source": t_source}
        self.ev_location = ev_location = np.empty(len(self.kinds), np.int64)
        ev_location[ci], ev_location[ti], ev_location[di] = c_memory, t_target, d_location

    def _code_labels(self, columns: EventColumns, at_c: np.ndarray) -> None:
        """Find the label codes of the computations, and of their groups and origins.

        ``at_c`` are the computations' positions in ``columns``.  Sets
        ``new_labels`` (see :meth:`_labels`) and ``c["label"]``, ``c["group"]``
        and ``c["origin"]``; a computation without a group or an origin has its
        own label for it.
        """
        builder, scalar_only, ci = self.builder, self._scalar_only, self.ci
        c_label, self.new_labels = self._labels(columns, at_c, self.c_key)
        scalar_only[ci] |= c_label < 0
        labels = builder.store.labels.codes.get
        c_group = c_origin = c_label
        group = columns.group[at_c]
        if (group >= 0).any():
            c_group = np.where(group < 0, c_label,
                               arrays.codes(columns, "label", builder, group, labels))
            scalar_only[ci] |= (c_group < 0) & (self.n_inputs == 1)
        origin = columns.origin[at_c]
        if (origin >= 0).any():
            c_origin = np.where(origin < 0, c_label,
                                arrays.codes(columns, "label", builder, origin, labels))
            scalar_only[ci] |= c_origin < 0
        self.c.update(label=c_label, group=c_group, origin=c_origin)

    def _check_keys_are_new(self, c_key_index: np.ndarray) -> None:
        """Mark the computations of keys held already, or written earlier in the window.

        ``c_key_index`` are the computations' keys.  A routine computation
        creates its key: nothing holds it before, in or before the window (else
        the key's code and copies need the scalar path).
        """
        ci, scalar_only = self.ci, self._scalar_only
        scalar_only[ci] |= np.fromiter(map(self.builder.holdings.newest.__contains__,
                                           self.c_key), bool, len(ci))
        scalar_only[ci] |= self.first_event[c_key_index] != ci

    def _look_up_sources(self) -> None:
        """Find what each lookup finds, as of its event: an as-of join of the slots.

        A slot is a ``(key, location)`` pair, numbered ``key * n_locations +
        location + 1``.  The lookups: each computation's inputs in its
        worker's memory, a transfer's source and target, a deletion's copy,
        a queued computation's releaser.  Sets ``ev_slot``, the slot each
        event writes; ``slot_order`` (see :func:`~crux_dask.graph.arrays.as_of`);
        what the lookups found, ``input_src``, ``t["src"]``, ``t["before"]``,
        ``d["src"]`` and ``releaser``; and ``_input_event``, the computation
        each input is of.
        """
        ci, ti, di, kinds, ev_key = self.ci, self.ti, self.di, self.kinds, self.ev_key
        n_inputs, queued, scalar_only = self.n_inputs, self.queued, self._scalar_only
        self.base = base = self.builder.store.n_states
        n_locations = len(self.builder.store.locations) + 1
        self.ev_slot = ev_slot = ev_key * n_locations + self.ev_location + 1
        written = np.where(kinds == DELETE, _DEAD, base + np.arange(len(kinds)))
        self._input_event = input_event = np.repeat(ci, n_inputs)
        lookup_slot = np.concatenate([
            self._input_key * n_locations + np.repeat(self.c["memory"], n_inputs) + 1,
            ev_key[ti] * n_locations + self.t["source"] + 1, ev_slot[ti], ev_slot[di],
            self._releaser_key * n_locations + self._releaser_memory + 1])
        looked_up, self.slot_order = arrays.as_of(
            ev_slot, written, lookup_slot, np.concatenate([input_event, ti, ti, di,
                                                           ci[queued]]))
        self._look_up_held(looked_up, lookup_slot, n_locations)
        input_src, t_src, t_before, d_src, releaser = np.split(
            looked_up, np.cumsum([len(input_event), len(ti), len(ti), len(di)]))
        scalar_only[input_event[input_src < 0]] = True
        scalar_only[ci[queued[releaser < 0]]] = True  # a releaser released or not reported yet
        scalar_only[ti] |= t_src < 0
        scalar_only[di] |= d_src < 0
        self.input_src, self.releaser = input_src, releaser
        self.t.update(src=t_src, before=t_before)
        self.d = {"src": d_src}

    def _check_shuffles(self) -> None:
        """Mark the computations that take a key of a shuffle, and the deletions of a
        shuffle's barrier: a shuffle's barrier, its outputs and its release are the
        scalar path's."""
        shuffles = self.builder.shuffles
        if not shuffles.keys:
            return
        names, input_key, scalar_only = self.names, self._input_key, self._scalar_only
        scalar_only[self._input_event[np.fromiter(
            map(shuffles.keys.__contains__, map(names.__getitem__, input_key.tolist())),
            bool, len(input_key))]] = True
        di = self.di
        scalar_only[di] |= np.fromiter(
            map(shuffles.barriers.__contains__, map(names.__getitem__, self.ev_key[di].tolist())),
            bool, len(di))

    def _find_roots(self, columns: EventColumns, at_c: np.ndarray) -> None:
        """Find the state each computation without inputs takes: its graph's root.

        ``at_c`` are the computations' positions in ``columns``.  Sets
        ``c["root"]``: the root state the event names if the builder knows it,
        else the run's root (``-1`` for computations with inputs).
        """
        ci, scalar_only = self.ci, self._scalar_only
        c_root = np.full(len(ci), -1, np.int64)
        no_inputs = self.n_inputs == 0
        roots, run_root = self.builder.roots, self.builder.run_root
        if no_inputs.any():
            c_root[no_inputs] = [r if r in roots else run_root
                                 for r in columns.root[at_c[no_inputs]].tolist()]
            scalar_only[ci[no_inputs]] |= c_root[no_inputs] < 0
        self.c["root"] = c_root

    def _check_waited_for(self) -> None:
        """Mark the events that create a state events wait for: the scalar path releases
        them."""
        waiting = self.builder.waiting
        if not waiting.events:
            return
        creates = np.flatnonzero(self.kinds != DELETE)
        slots = zip(map(self.names.__getitem__, self.ev_key[creates].tolist()),
                    self.ev_location[creates].tolist())
        self._scalar_only[creates] |= np.fromiter(map(waiting.__contains__, slots), bool,
                                                  len(creates))

    def _take_prefix(self, columns: EventColumns, at_c: np.ndarray, at_t: np.ndarray,
                     at_d: np.ndarray) -> None:
        """Cut the plan to the events before the first one marked; sets ``n``.

        Adds to ``c``, ``t`` and ``d`` the fields of the events the commit
        reads from ``columns``, where ``at_c``, ``at_t`` and ``at_d`` are the
        positions of the computations, transfers and deletions.
        """
        self.n = f = arrays.first(self._scalar_only, len(self.kinds))
        ci, ti, di = self.ci, self.ti, self.di
        keep_c, keep_t, keep_d = ci < f, ti < f, di < f
        self.kinds = self.kinds[:f]
        self.ev_key, self.ev_location, self.ev_slot = (
            self.ev_key[:f], self.ev_location[:f], self.ev_slot[:f])
        self.ci, self.ti, self.di = ci[keep_c], ti[keep_t], di[keep_d]
        self.n_inputs = self.n_inputs[keep_c]
        self.input_src = self.input_src[:int(self.n_inputs.sum())]
        self.c_key = self.c_key[:len(self.ci)]
        kept = ci[self.queued] < f
        self.queued, self.releaser = self.queued[kept], self.releaser[kept]
        at_c, at_t, at_d = at_c[keep_c], at_t[keep_t], at_d[keep_d]
        roots, time_of = self.builder.roots, self.builder.store.state_time
        t_nbytes = columns.nbytes[at_t]
        c, t = self.c, self.t
        self.c = {"start": columns.start[at_c], "stop": columns.stop[at_c],
                  "nbytes": columns.nbytes[at_c], "thread": columns.thread[at_c],
                  "memory": c["memory"][keep_c], "label": c["label"][keep_c],
                  "group": c["group"][keep_c], "origin": c["origin"][keep_c],
                  "root": c["root"][keep_c], "requested": columns.requested[at_c],
                  "received": columns.received[at_c], "runnable": columns.runnable[at_c],
                  "priority": columns.priority[at_c], "announced": columns.announced[at_c],
                  "cpu": columns.cpu[at_c], "cpu_wait": columns.cpu_wait[at_c],
                  "submitted": np.array([time_of[r] if r in roots else np.nan
                                         for r in columns.root[at_c].tolist()])}
        self.t = {"start": columns.start[at_t], "stop": columns.stop[at_t],
                  "nbytes": t_nbytes, "no_nbytes": t_nbytes < 0,
                  "source": t["source"][keep_t], "src": t["src"][keep_t],
                  "before": t["before"][keep_t], "requested": columns.requested[at_t]}
        self.d = {"time": columns.start[at_d], "src": self.d["src"][keep_d]}

    def _labels(self, columns: EventColumns, at: np.ndarray, keys: list[str]
                ) -> tuple[np.ndarray, list[str]]:
        """Label codes of computations, and the labels new to the graph in order of first use.

        A new label gets the code it will have once added, as the scalar path
        adds it: ``len(labels)`` on, in order of first use.
        """
        store = self.builder.store
        labels = store.labels.codes.get
        label = columns.label[at]
        if (label < 0).any():  # no label given: the key's prefix, as the scalar path does
            names = columns.strings
            text = [rules.key_label(k) if i < 0 else names[i] for k, i in zip(keys, label.tolist())]
            return arrays.encode(text, labels, new_from=len(store.labels))
        codes = arrays.codes(columns, "label", self.builder, label, labels)
        unknown = codes < 0
        if not unknown.any():
            return codes, []
        fresh, first = np.unique(label[unknown], return_index=True)
        fresh = fresh[np.argsort(first)]
        new = [columns.strings[i] for i in fresh.tolist()]
        mapping = np.full(len(columns.strings), -1, np.int64)
        mapping[fresh] = len(store.labels) + np.arange(len(fresh))
        codes[unknown] = mapping[label[unknown]]
        return codes, new

    def _look_up_held(self, looked_up: np.ndarray, lookup_slot: np.ndarray,
                      n_locations: int) -> None:
        """Fill in, in place, lookups of slots the window did not write: the data held before."""
        missing = np.flatnonzero(looked_up == _MISSING)
        if not len(missing):
            return
        builder = self.builder
        key, location = np.divmod(lookup_slot[missing], n_locations)
        location -= 1
        wanted = np.zeros(len(self.names), bool)
        wanted[key] = True
        wanted = np.flatnonzero(wanted)
        newest = np.full(len(self.names), _MISSING, np.int64)
        newest[wanted] = np.fromiter(
            map(builder.holdings.newest.get, map(self.names.__getitem__, wanted.tolist()),
                repeat(_MISSING)), np.int64, len(wanted))
        found = newest[key]
        held = np.flatnonzero(found >= 0)
        elsewhere = held[builder.store.column("state_location", found[held]) != location[held]]
        copies = builder.holdings.others
        for i, name, where in zip(elsewhere.tolist(),
                                  map(self.names.__getitem__, key[elsewhere].tolist()),
                                  location[elsewhere].tolist()):
            copy = copies.get(name)
            found[i] = copy.get(where, _MISSING) if copy else _MISSING
        looked_up[missing] = found

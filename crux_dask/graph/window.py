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
    :func:`~crux_dask.graph.commit.commit`."""

    def __init__(self, builder: PAGBuilder, columns: EventColumns, lo: int, hi: int) -> None:
        self.builder = builder
        store = builder.store
        kinds = columns.kind[lo:hi]
        n = arrays.first(kinds == OTHER, len(kinds))
        kinds = kinds[:n]
        ci, ti, di = (np.flatnonzero(kinds == kind) for kind in (COMPUTE, TRANSFER, DELETE))
        nc = len(ci)
        at_c, at_t, at_d = lo + ci, lo + ti, lo + di
        bad = np.zeros(n, bool)  # events the window leaves to the scalar path

        # A key is its index in the strings; ``first_event`` is the event of
        # the window that first writes it (``n`` for keys it does not write).
        names = self.names = columns.strings
        ev_key = columns.key[lo:lo + n]
        first_event = np.full(len(names), n, np.int64)
        np.minimum.at(first_event, ev_key, np.arange(n))
        self.first_event = first_event
        offset = columns.input_offset
        input_key = columns.inputs[offset[lo]:offset[lo + n]]
        n_inputs = columns.input_count[at_c]
        c_key_index = ev_key[ci]
        c_key = list(map(names.__getitem__, c_key_index.tolist()))
        c_worker = columns.location[at_c]
        c_memory = arrays.codes(columns, "memory", builder, c_worker, builder.places.memory.get)
        location = store.locations.codes.get

        def location_codes(indices: np.ndarray) -> np.ndarray:
            return arrays.codes(columns, "location", builder, indices, location)

        # A queued task: the task whose end freed its slot, held in that task's worker's memory.
        c_released_by, c_released_on = columns.released_by[at_c], columns.released_on[at_c]
        queued = np.flatnonzero(c_released_by >= 0)
        bad[ci] |= (c_released_by >= 0) != (c_released_on >= 0)  # one without the other
        releaser_memory = arrays.codes(columns, "memory", builder, c_released_on[queued],
                                       builder.places.memory.get)
        bad[ci[queued]] |= releaser_memory < 0
        t_source_code = location_codes(columns.source[at_t])
        t_target_code = location_codes(columns.location[at_t])
        d_location_code = location_codes(columns.location[at_d])
        bad[ci] |= c_memory < 0
        bad[ti] |= (t_source_code < 0) | (t_target_code < 0)
        bad[ti] |= t_target_code == builder.places.root
        bad[di] |= d_location_code < 0
        c_label_code, self.new_labels = self._labels(columns, at_c, c_key)
        bad[ci] |= c_label_code < 0
        labels = store.labels.codes.get
        c_group_code, c_origin_code = c_label_code, c_label_code
        c_group = columns.group[at_c]
        if (c_group >= 0).any():
            c_group_code = np.where(c_group < 0, c_label_code,
                                    arrays.codes(columns, "label", builder, c_group, labels))
            bad[ci] |= (c_group_code < 0) & (n_inputs == 1)
        c_origin = columns.origin[at_c]
        if (c_origin >= 0).any():
            c_origin_code = np.where(c_origin < 0, c_label_code,
                                     arrays.codes(columns, "label", builder, c_origin, labels))
            bad[ci] |= c_origin_code < 0

        # A routine computation creates its key: nothing holds it before, in or
        # before the window (else the key's code and copies need the scalar path).
        bad[ci] |= np.fromiter(map(builder.holdings.newest.__contains__, c_key), bool, nc)
        bad[ci] |= first_event[c_key_index] != ci

        # What each lookup finds: inputs, a transfer's source and target, a release.
        n_locations = len(store.locations) + 1
        ev_location = np.empty(n, np.int64)
        ev_location[ci], ev_location[ti], ev_location[di] = (
            c_memory, t_target_code, d_location_code)
        ev_slot = ev_key * n_locations + ev_location + 1
        base = store.n_states
        written = np.where(kinds == DELETE, _DEAD, base + np.arange(n))
        input_event = np.repeat(ci, n_inputs)
        lookup_slot = np.concatenate([
            input_key * n_locations + np.repeat(c_memory, n_inputs) + 1,
            ev_key[ti] * n_locations + t_source_code + 1, ev_slot[ti], ev_slot[di],
            c_released_by[queued] * n_locations + releaser_memory + 1])
        looked_up, self.slot_order = arrays.as_of(
            ev_slot, written, lookup_slot, np.concatenate([input_event, ti, ti, di,
                                                           ci[queued]]))
        self._look_up_held(looked_up, lookup_slot, n_locations)
        input_src, t_src, t_before, d_src, releaser = np.split(
            looked_up, np.cumsum([len(input_event), len(ti), len(ti), len(di)]))
        bad[input_event[input_src < 0]] = True
        bad[ci[queued[releaser < 0]]] = True  # a releaser released or not reported yet
        shuffles = builder.shuffles
        if shuffles.keys:  # a shuffle's barrier, its outputs, its release: the scalar path
            bad[input_event[np.fromiter(
                map(shuffles.keys.__contains__, map(names.__getitem__, input_key.tolist())),
                bool, len(input_key))]] = True
            bad[di] |= np.fromiter(
                map(shuffles.barriers.__contains__, map(names.__getitem__, ev_key[di].tolist())),
                bool, len(di))
        bad[ti] |= t_src < 0
        bad[di] |= d_src < 0
        c_root_state = np.full(nc, -1, np.int64)
        no_inputs = n_inputs == 0
        roots, run_root = builder.roots, builder.run_root
        time_of = builder.store.state_time
        if no_inputs.any():
            c_root_state[no_inputs] = [r if r in roots else run_root
                                       for r in columns.root[at_c[no_inputs]].tolist()]
            bad[ci[no_inputs]] |= c_root_state[no_inputs] < 0
        if builder.waiting.events:  # a state that events wait for: the scalar path releases them
            creates = np.flatnonzero(kinds != DELETE)
            slots = zip(map(names.__getitem__, ev_key[creates].tolist()),
                        ev_location[creates].tolist())
            bad[creates] |= np.fromiter(map(builder.waiting.__contains__, slots), bool,
                                        len(creates))

        # The prefix the window takes.
        self.n = f = arrays.first(bad, n)
        self.base, self.kinds = base, kinds[:f]
        self.ev_key, self.ev_location, self.ev_slot = ev_key[:f], ev_location[:f], ev_slot[:f]
        keep_c, keep_t, keep_d = ci < f, ti < f, di < f
        self.ci, self.ti, self.di = ci[keep_c], ti[keep_t], di[keep_d]
        self.n_inputs = n_inputs[keep_c]
        self.input_src = input_src[:int(self.n_inputs.sum())]
        self.c_key = c_key[:len(self.ci)]
        kept = ci[queued] < f
        self.queued, self.releaser = queued[kept], releaser[kept]
        at_c, at_t, at_d = at_c[keep_c], at_t[keep_t], at_d[keep_d]
        t_nbytes = columns.nbytes[at_t]
        self.c = {"start": columns.start[at_c], "stop": columns.stop[at_c],
                  "nbytes": columns.nbytes[at_c], "thread": columns.thread[at_c],
                  "memory": c_memory[keep_c], "label": c_label_code[keep_c],
                  "group": c_group_code[keep_c], "origin": c_origin_code[keep_c],
                  "root": c_root_state[keep_c], "requested": columns.requested[at_c],
                  "received": columns.received[at_c], "runnable": columns.runnable[at_c],
                  "priority": columns.priority[at_c],
                  "submitted": np.array([time_of[r] if r in roots else np.nan
                                         for r in columns.root[at_c].tolist()])}
        self.t = {"start": columns.start[at_t], "stop": columns.stop[at_t],
                  "nbytes": t_nbytes, "no_nbytes": t_nbytes < 0,
                  "source": t_source_code[keep_t], "src": t_src[keep_t],
                  "before": t_before[keep_t], "requested": columns.requested[at_t]}
        self.d = {"time": columns.start[at_d], "src": d_src[keep_d]}

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

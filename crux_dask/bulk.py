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
random event sequences.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import chain, repeat
from typing import TYPE_CHECKING

import numpy as np

from crux_dask.schema import MutationKind
from crux_dask.store import NO_CODE, NO_THREAD, PAGStore

if TYPE_CHECKING:
    from crux_dask.builder import PAGBuilder

__all__ = ["apply_window"]

_COMPUTE, _TRANSFER, _DELETE, _OTHER = 0, 1, 2, 3
_KIND_CODES = {"compute": _COMPUTE, "transfer": _TRANSFER, "delete": _DELETE}
_WIDTHS = {_COMPUTE: 15, _TRANSFER: 7, _DELETE: 4}
#: What a lookup finds in a slot released in the window, and in a slot nothing wrote.
_DEAD, _MISSING = -1, -2
_NO_GROUP = -2


def apply_window(builder: PAGBuilder, events: list) -> int:
    """Apply the leading routine events of ``events``; return how many.

    Raises
    ------
    Exception
        Whatever a malformed window raises while it is planned; nothing is
        applied then, and the caller applies the events one by one.
    """
    window = _Window(builder, events)
    if window.n:
        window.commit()
    return window.n


class _Window:
    """One window: planned in ``__init__`` (no side effects), applied by :meth:`commit`."""

    def __init__(self, builder: PAGBuilder, events: list) -> None:
        self.builder = builder
        store = builder.store
        # Every field of every event in one flat array: an event's fields start
        # at its offset, so a column is one gather.
        lengths = np.fromiter(map(len, events), np.int64, len(events))
        flat = np.fromiter(chain.from_iterable(events), object, int(lengths.sum()))
        offsets = np.cumsum(lengths) - lengths
        head = flat[np.minimum(offsets, max(len(flat) - 1, 0))] if len(flat) else flat
        kinds = np.full(len(events), _OTHER, np.int8)
        for name, kind in _KIND_CODES.items():
            kinds[(lengths == _WIDTHS[kind]) & (head == name)] = kind
        n = _first(kinds == _OTHER, len(events))
        kinds = kinds[:n]
        ci, ti, di = (np.flatnonzero(kinds == kind) for kind in (_COMPUTE, _TRANSFER, _DELETE))
        nc = len(ci)

        def field(at: np.ndarray, index: int) -> np.ndarray:
            return flat[offsets[at] + index]

        bad = np.zeros(n, bool)  # events the window leaves to the scalar path

        def numbers(at: np.ndarray, index: int, kind: type, none: int | None = None):
            values, wrong = _numbers(field(at, index).tolist(), kind, none)
            bad[at] |= wrong
            return values

        c_start = numbers(ci, 4, float)
        c_stop = numbers(ci, 5, float)
        c_nbytes = numbers(ci, 6, int)
        c_thread = numbers(ci, 3, int, NO_THREAD)
        t_start = numbers(ti, 4, float)
        t_stop = numbers(ti, 5, float)
        t_no_nbytes = field(ti, 6) == None  # noqa: E711 - elementwise
        t_nbytes = numbers(ti, 6, int, -1)
        d_time = numbers(di, 3, float)
        for index in (11, 12):  # annotations: a mutation kind, a location
            bad[ci] |= field(ci, index) != None  # noqa: E711 - elementwise
        bad[ci] |= np.fromiter(map(bool, field(ci, 14).tolist()), bool, nc)  # reads

        # A key's id is the first event of the window that writes it (inputs
        # written before the window get ids from n on); locations and labels
        # are the graph's codes.
        names = flat[offsets[:n] + 1].tolist()
        first_write = dict(zip(reversed(names), range(n - 1, -1, -1)))
        ev_key = np.fromiter(map(first_write.__getitem__, names), np.int64, n)
        c_inputs = field(ci, 7).tolist()
        n_inputs = np.fromiter(map(len, c_inputs), np.int64, nc)
        inputs = list(chain.from_iterable(c_inputs))
        input_key = np.fromiter(map(first_write.get, inputs, repeat(-1)), np.int64,
                                len(inputs))
        earlier = np.flatnonzero(input_key < 0)
        if len(earlier):
            held, held_id = _factorize(list(map(inputs.__getitem__, earlier.tolist())))
            input_key[earlier] = n + held_id
            names += held
        self.names = names
        c_key = field(ci, 1).tolist()
        c_worker = field(ci, 2).tolist()
        c_label = field(ci, 9).tolist()
        c_group = field(ci, 10).tolist()
        c_origin = field(ci, 13).tolist()
        c_root = field(ci, 8)
        t_source = field(ti, 2).tolist()
        t_target = field(ti, 3).tolist()
        d_location = field(di, 2).tolist()
        c_memory, _ = _encode(c_worker, builder._memory_codes.get)
        locations = store.locations.codes.get
        t_source_code, _ = _encode(t_source, locations)
        t_target_code, _ = _encode(t_target, locations)
        d_location_code, _ = _encode(d_location, locations)
        bad[ci] |= c_memory < 0
        bad[ti] |= (t_source_code < 0) | (t_target_code < 0)
        bad[ti] |= t_target_code == builder._root_location
        bad[di] |= d_location_code < 0
        if c_label.count(None):
            from crux_dask.builder import _prefix

            c_label = [_prefix(k) if v is None else v for k, v in zip(c_key, c_label)]
        # A new label is added as the scalar path would: in order of first use.
        labels = store.labels.codes.get
        c_label_code, self.new_labels = _encode(c_label, labels, new_from=len(store.labels))
        bad[ci] |= c_label_code < 0
        c_group_code, c_origin_code = c_label_code, c_label_code
        if c_group.count(None) != nc:
            c_group_code = np.where(_is_none(c_group), c_label_code, _encode(c_group, labels)[0])
            bad[ci] |= (c_group_code < 0) & (n_inputs == 1)
        if c_origin.count(None) != nc:
            c_origin_code = np.where(_is_none(c_origin), c_label_code,
                                     _encode(c_origin, labels)[0])
            bad[ci] |= c_origin_code < 0

        # A routine computation creates its key: nothing holds it before, in or
        # before the window (else the key's code and copies need the scalar path).
        bad[ci] |= np.fromiter(map(builder._live.__contains__, c_key), bool, nc)
        bad[ci] |= ev_key[ci] != ci

        # What each lookup finds: inputs, a transfer's source and target, a release.
        n_locations = len(store.locations) + 1
        ev_location = np.empty(n, np.int64)
        ev_location[ci], ev_location[ti], ev_location[di] = (
            c_memory, t_target_code, d_location_code)
        ev_slot = ev_key * n_locations + ev_location + 1
        base = store.n_states
        written = np.where(kinds == _DELETE, _DEAD, base + np.arange(n))
        input_event = np.repeat(ci, n_inputs)
        lookup_slot = np.concatenate([
            input_key * n_locations + np.repeat(c_memory, n_inputs) + 1,
            ev_key[ti] * n_locations + t_source_code + 1, ev_slot[ti], ev_slot[di]])
        looked_up, self.slot_order = _as_of(
            ev_slot, written, lookup_slot, np.concatenate([input_event, ti, ti, di]))
        self._look_up_held(looked_up, lookup_slot, n_locations)
        input_src, t_src, t_before, d_src = np.split(
            looked_up, np.cumsum([len(input_event), len(ti), len(ti)]))
        bad[input_event[input_src < 0]] = True
        bad[ti] |= t_src < 0
        bad[di] |= d_src < 0
        c_root_state = np.full(nc, -1, np.int64)
        no_inputs = n_inputs == 0
        if no_inputs.any():
            roots, run_root = builder._roots, builder._run_root
            c_root_state[no_inputs] = [r if r in roots else run_root
                                       for r in c_root[no_inputs].tolist()]
            bad[ci] |= c_root_state < 0
        if builder._parked:  # a state that waiting events need: the scalar path releases them
            creates = np.flatnonzero(kinds != _DELETE)
            slots = zip(map(self.names.__getitem__, ev_key[creates].tolist()),
                        ev_location[creates].tolist())
            bad[creates] |= np.fromiter(map(builder._parked.__contains__, slots), bool,
                                        len(creates))

        # The prefix the window takes.
        self.n = f = _first(bad, n)
        self.base, self.kinds = base, kinds[:f]
        self.ev_key, self.ev_location, self.ev_slot = ev_key[:f], ev_location[:f], ev_slot[:f]
        keep_c, keep_t, keep_d = ci < f, ti < f, di < f
        self.ci, self.ti, self.di = ci[keep_c], ti[keep_t], di[keep_d]
        self.n_inputs = n_inputs[keep_c]
        self.input_src = input_src[:int(self.n_inputs.sum())]
        self.c_key = c_key[:len(self.ci)]
        self.c = {"start": c_start[keep_c], "stop": c_stop[keep_c],
                  "nbytes": c_nbytes[keep_c], "thread": c_thread[keep_c],
                  "memory": c_memory[keep_c], "label": c_label_code[keep_c],
                  "group": c_group_code[keep_c], "origin": c_origin_code[keep_c],
                  "root": c_root_state[keep_c]}
        self.t = {"start": t_start[keep_t], "stop": t_stop[keep_t],
                  "nbytes": t_nbytes[keep_t], "no_nbytes": t_no_nbytes[keep_t],
                  "source": t_source_code[keep_t], "src": t_src[keep_t],
                  "before": t_before[keep_t]}
        self.d = {"time": d_time[keep_d], "src": d_src[keep_d]}

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
            map(builder._live.get, map(self.names.__getitem__, wanted.tolist()),
                repeat(_MISSING)), np.int64, len(wanted))
        found = newest[key]
        held = np.flatnonzero(found >= 0)
        elsewhere = held[builder.store.column("state_location", found[held]) != location[held]]
        copies = builder._copies
        for i, name, where in zip(elsewhere.tolist(),
                                  map(self.names.__getitem__, key[elsewhere].tolist()),
                                  location[elsewhere].tolist()):
            copy = copies.get(name)
            found[i] = copy.get(where, _MISSING) if copy else _MISSING
        looked_up[missing] = found

    # -- applying -----------------------------------------------------------
    def commit(self) -> None:
        """Append the window's states and mutations and update the builder."""
        builder, store = self.builder, self.builder.store
        f, base, kinds = self.n, self.base, self.kinds
        ci, ti, di, c, t, d = self.ci, self.ti, self.di, self.c, self.t, self.d
        ids = base + np.arange(f)
        time = np.empty(f)
        start = np.empty(f)
        time[ci], start[ci] = c["stop"], c["start"]
        time[ti], start[ti] = t["stop"], t["start"]
        time[di] = start[di] = d["time"]
        n_mutations = np.ones(f, np.int64)
        n_mutations[ci] = np.maximum(self.n_inputs, 1)
        m0 = store.n_mutations
        first_mutation = m0 + np.cumsum(n_mutations) - n_mutations

        # What a copy takes from its source (which may be in the window too).
        copies = np.concatenate([ti, di])
        sources = np.concatenate([t["src"], d["src"]])
        ready = time.copy()
        _follow(ready, ti, t["src"], t["stop"] - t["start"], base, store, "state_ready")
        size = np.zeros(f, np.int64)
        size[ci], size[ti] = c["nbytes"], t["nbytes"]
        no_nbytes = t["no_nbytes"]
        _follow(size, ti[no_nbytes], t["src"][no_nbytes], 0, base, store, "state_size")
        key_code = np.empty(f, np.int64)
        key_code[ci] = len(store.keys) + np.arange(len(ci))
        _follow(key_code, copies, sources, 0, base, store, "state_key")
        location_workers = np.full(len(store.locations), NO_CODE, np.int64)
        location_workers[list(builder._location_workers)] = list(
            builder._location_workers.values())
        worker = np.empty(f, np.int64)
        worker[ci] = location_workers[c["memory"]]
        t_worker = location_workers[self.ev_location[ti]]
        worker[ti] = np.where(t_worker == NO_CODE, location_workers[t["source"]], t_worker)
        worker[di] = _values_of(worker, d["src"], base, store, "state_worker")
        thread = np.full(f, NO_THREAD, np.int64)
        thread[ci] = c["thread"]

        # Mutations: a computation's inputs (or its graph's root), a copy's source.
        n_inputs = self.n_inputs
        c_mutations = n_mutations[ci]
        c_first = np.cumsum(c_mutations) - c_mutations
        no_inputs = n_inputs == 0
        c_src = np.empty(int(c_mutations.sum()), np.int64)
        takes_input = np.ones(len(c_src), bool)
        takes_input[c_first[no_inputs]] = False
        c_src[takes_input] = self.input_src
        c_src[c_first[no_inputs]] = c["root"][no_inputs]
        pred = first_mutation.copy()
        pred[ci] += _first_max(_values_of(ready, c_src, base, store, "state_ready"),
                               c_first, c_mutations)
        c_kind = np.where(no_inputs, MutationKind.APPEND,
                          np.where(n_inputs > 1, MutationKind.MERGE, MutationKind.CONVERT))
        single = np.flatnonzero(n_inputs == 1)
        c_kind[single] = self._convert_or_split(
            c_src[c_first[single]], c["group"][single], first_mutation[ci[single]])
        m_src = np.empty(int(n_mutations.sum()), np.int64)
        m_kind = np.empty(len(m_src), np.int8)
        m_busy = np.zeros(len(m_src))
        c_rows = np.repeat(first_mutation[ci] - m0 - c_first, c_mutations) + np.arange(len(c_src))
        m_src[c_rows] = c_src
        m_kind[c_rows] = np.repeat(c_kind, c_mutations)
        m_busy[c_rows] = np.repeat(c["stop"] - c["start"], c_mutations)
        copy_rows = first_mutation[copies] - m0
        m_src[copy_rows] = sources
        m_kind[copy_rows] = np.repeat([MutationKind.TRANSFER, MutationKind.DELETE],
                                      [len(ti), len(di)])
        m_busy[copy_rows[:len(ti)]] = t["stop"] - t["start"]

        # Append: labels, keys, states, mutations.
        n_labels = len(store.labels)
        for label in self.new_labels[:len(np.unique(c["label"][c["label"] >= n_labels]))]:
            store.labels.code(label)
        store.keys.values.extend(self.c_key)
        _extend(store.key_label, c["label"])
        _extend(store.key_origin, c["origin"])
        for name, values in (("time", time), ("start", start), ("ready", ready),
                             ("size", size), ("key", key_code),
                             ("location", self.ev_location), ("worker", worker),
                             ("thread", thread), ("pred", pred)):
            _extend(getattr(store, f"state_{name}"), values)
        for name, values in (("src", m_src), ("dst", np.repeat(ids, n_mutations)),
                             ("kind", m_kind), ("busy", m_busy)):
            _extend(getattr(store, f"mutation_{name}"), values)

        # The builder's view of what is held where, and of the graph's end.
        self._update_held(ids)
        deque(map(builder._fanout.pop, d["src"].tolist(), repeat(None)), maxlen=0)
        created = np.flatnonzero(kinds != _DELETE)
        if len(created):
            latest = time[created].max()
            if latest >= builder._end_time:
                builder.end = int(ids[created[time[created] == latest][-1]])
                builder._end_time = float(latest)
        builder.n_applied += f

    def _convert_or_split(self, src: np.ndarray, group: np.ndarray,
                          mutation: np.ndarray) -> np.ndarray:
        """Kinds of single-input mutations, recording each source's fan-out in the builder.

        A single-input mutation is a ``SPLIT`` when the one before or after
        it from the same source is by the same task group, else a ``CONVERT``.
        """
        builder = self.builder
        fanout = builder._fanout
        order = np.argsort(src, kind="stable")
        src, group, mutation = src[order], group[order], mutation[order]
        first = np.ones(len(src), bool)
        first[1:] = src[1:] != src[:-1]
        last = np.ones(len(src), bool)
        last[:-1] = first[1:]
        seen = [fanout.get(s, (_NO_GROUP, -1)) for s in src[first].tolist()]
        before = np.empty_like(group)
        before[1:] = group[:-1]
        before[first] = [g for g, _ in seen]
        same_before = group == before
        same_after = np.zeros(len(src), bool)
        same_after[:-1] = ~last[:-1] & (group[1:] == group[:-1])
        seen_mutation = np.asarray([m for _, m in seen], np.int64)
        for m in seen_mutation[same_before[first] & (seen_mutation >= 0)].tolist():
            # A first sibling recorded before the window.
            builder.store.mutation_kind[m] = MutationKind.SPLIT
        fanout.update(zip(src[last].tolist(), zip(
            group[last].tolist(), np.where(same_before[last], -1, mutation[last]).tolist())))
        kinds = np.empty(len(src), np.int64)
        kinds[order] = np.where(same_before | same_after, MutationKind.SPLIT, MutationKind.CONVERT)
        return kinds

    def _update_held(self, ids: np.ndarray) -> None:
        """Bring the builder's ``_live`` and ``_copies`` to what is held after the window.

        Keys the window created end up with one copy or none, which arrays
        settle; a key with several copies, or held before the window, gets
        its writes replayed through the builder's own bookkeeping.
        """
        builder = self.builder
        live, copies = builder._live, builder._copies
        names, kinds = self.names, self.kinds
        # The last write of each slot: the slot order of the as-of join, cut to the prefix.
        writes = self.slot_order[self.slot_order < self.n]
        slot = self.ev_slot[writes]
        ends = np.ones(len(writes), bool)
        ends[:-1] = slot[1:] != slot[:-1]
        last = writes[ends]
        final = np.where(kinds[last] == _DELETE, _DEAD, ids[last])
        final_key = self.ev_key[last]
        # Slots sort by key first; a key's id is the event that first writes it.
        keys = final_key[np.r_[True, final_key[1:] != final_key[:-1]]]
        created = kinds[keys] == _COMPUTE
        held_before = np.zeros(len(keys), bool)
        earlier = np.flatnonzero(~created)
        earlier_names = list(map(names.__getitem__, keys[earlier].tolist()))
        held_before[earlier] = np.fromiter(map(live.__contains__, earlier_names), bool,
                                           len(earlier))
        regular = np.ones(len(keys), bool)  # one copy before, or none: counts tell the rest
        if copies:
            regular[earlier] = ~np.fromiter(map(copies.__contains__, earlier_names), bool,
                                            len(earlier))
        delta = np.ones(self.n, np.int64)
        delta[self.ti] = self.t["before"] < 0
        delta[self.di] = -1
        held_after = held_before + np.bincount(
            self.ev_key, delta, len(names)).astype(np.int64)[keys]

        gone = list(map(names.__getitem__, keys[regular & held_before & (held_after == 0)]
                        .tolist()))
        deque(map(live.pop, gone, repeat(None)), maxlen=0)
        sole = (created & (held_after == 1))[np.searchsorted(keys, final_key)] & (final >= 0)
        live.update(zip(map(names.__getitem__, final_key[sole].tolist()), final[sole].tolist()))
        replay = keys[(held_after > 0) & ~(created & (held_after == 1))
                      | held_before & ~regular]
        if not len(replay):
            return
        marked = np.zeros(len(names), bool)
        marked[replay] = True
        events = np.flatnonzero(marked[self.ev_key])
        for name, location, sid, kind in zip(
                map(names.__getitem__, self.ev_key[events].tolist()),
                self.ev_location[events].tolist(), ids[events].tolist(),
                kinds[events].tolist()):
            if kind == _DELETE:
                builder._drop_held(name, location)
            else:
                builder._live_add(name, location, sid)


def _first(mask: np.ndarray, default: int) -> int:
    """Index of the first true value of ``mask``, or ``default``."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else default


def _is_none(column: tuple) -> np.ndarray:
    return np.fromiter((v is None for v in column), bool, len(column))


def _factorize(values: list) -> tuple[list, np.ndarray]:
    """Distinct values in order of first appearance, and the index of each value in them."""
    uniques = list(dict.fromkeys(values))
    index = dict(zip(uniques, range(len(uniques))))
    return uniques, np.fromiter(map(index.__getitem__, values), np.int64, len(values))


def _encode(column, lookup, new_from: int | None = None) -> tuple[np.ndarray, list]:
    """Codes of the strings of ``column`` by ``lookup``, and the strings not known.

    An unknown string gets ``-1`` or, with ``new_from``, the code it will get
    when added: ``new_from`` on, in order of first appearance.
    """
    uniques = list(dict.fromkeys(column))
    codes = [lookup(u) if isinstance(u, str) else None for u in uniques]
    unknown = [u for u, code in zip(uniques, codes) if code is None and isinstance(u, str)]
    fresh = iter(range(new_from, new_from + len(unknown))) if new_from is not None else None
    mapping = {u: code if code is not None else
               next(fresh) if fresh is not None and isinstance(u, str) else -1
               for u, code in zip(uniques, codes)}
    return np.fromiter(map(mapping.__getitem__, column), np.int64, len(column)), unknown


def _numbers(column: tuple, kind: type, none: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column, and which of its values only the scalar path may judge.

    ``kind`` is ``float`` (finite numbers) or ``int`` (64-bit integers);
    ``none`` is what ``None`` stands for, where it is allowed.
    """
    dtype = np.float64 if kind is float else np.int64
    if not len(column):
        return np.empty(0, dtype), np.zeros(0, bool)
    if none is not None and column.count(None) == len(column):
        return np.full(len(column), none, dtype), np.zeros(len(column), bool)
    values = np.array(column)
    if values.ndim == 1 and values.dtype.kind in ("iuf" if kind is float else "iu"):
        values = values.astype(dtype)
        wrong = ~np.isfinite(values) if kind is float else np.zeros(len(values), bool)
        return values, wrong
    out = np.zeros(len(column), dtype)
    wrong = np.zeros(len(column), bool)
    for i, value in enumerate(column):
        if value is None and none is not None:
            out[i] = none
        elif (type(value) is int and -2**63 <= value < 2**63) or (
                kind is float and type(value) is float and math.isfinite(value)):
            out[i] = value
        else:
            wrong[i] = True
    return out, wrong


def _as_of(write_slot: np.ndarray, written: np.ndarray, lookup_slot: np.ndarray,
           lookup_event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each lookup, what the last event before it wrote to its slot (or ``_MISSING``).

    Event ``i`` writes ``written[i]`` to ``write_slot[i]``; lookup ``j`` reads
    ``lookup_slot[j]`` just before event ``lookup_event[j]``.  Also returns
    the events in slot order (by slot, then in time), for what is held at the end.
    """
    n = len(write_slot)
    slot = np.concatenate([write_slot, lookup_slot])
    order = np.argsort(slot * (2 * n + 2)
                       + np.concatenate([2 * np.arange(n) + 1, 2 * lookup_event]))
    sorted_slot = slot[order]
    last_write = np.maximum.accumulate(np.where(order < n, np.arange(len(order)), 0))
    writer = order[last_write]
    found = (writer < n) & (sorted_slot[last_write] == sorted_slot)
    is_lookup = order >= n
    result = np.empty(len(lookup_slot), np.int64)
    result[order[is_lookup] - n] = np.where(found, written[np.minimum(writer, n - 1)],
                                            _MISSING)[is_lookup]
    return result, order[~is_lookup]


def _values_of(window: np.ndarray, states: np.ndarray, base: int, store: PAGStore,
               column: str) -> np.ndarray:
    """A column's values for ``states``: from the window for its own, else from the store."""
    out = np.empty(len(states), window.dtype)
    inside = states >= base
    out[inside] = window[states[inside] - base]
    if not inside.all():
        out[~inside] = store.column(column, states[~inside])
    return out


def _follow(values: np.ndarray, targets: np.ndarray, sources: np.ndarray, add,
            base: int, store: PAGStore, column: str) -> None:
    """``values[targets] = value of sources + add``, each source an earlier state.

    A source may be a target itself (a copy of a copy): repeat until nothing
    changes, as many rounds as the longest such chain.
    """
    add = np.broadcast_to(np.asarray(add, values.dtype), targets.shape)
    outside = sources < base
    if outside.any():
        values[targets[outside]] = store.column(column, sources[outside]) + add[outside]
    targets, sources, add = targets[~outside], sources[~outside] - base, add[~outside]
    for _ in range(len(targets) + 1):
        new = values[sources] + add
        if np.array_equal(new, values[targets]):
            return
        values[targets] = new


def _first_max(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per segment of ``values`` (all non-empty), the offset of its first largest value.

    NaN never wins, as in the scalar path's strict comparison.
    """
    if not len(starts):
        return np.zeros(0, np.int64)
    largest = np.fmax.reduceat(values, starts)
    offset = np.arange(len(values)) - np.repeat(starts, lengths)
    hits = np.where(values == np.repeat(largest, lengths), offset, len(values))
    first = np.minimum.reduceat(hits, starts)
    return np.where(first == len(values), 0, first)


def _extend(column, values: np.ndarray) -> None:
    """Append ``values`` to an :class:`array.array` column, converted to its type."""
    column.frombytes(memoryview(np.ascontiguousarray(values, dtype=column.typecode)).cast("B"))

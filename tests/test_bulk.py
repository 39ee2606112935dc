"""Windows of events applied at once give exactly what one by one gives."""

from __future__ import annotations

import math
import random
from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crux_dask.graph.feed as feed_module
from crux_dask import BatchError, PAGBuilder, decode_batch, encode_batch
from crux_dask.columns import EventColumns
from crux_dask.events import parse

WORKERS = ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"]
#: How far each worker's clock is off: a later state may carry an earlier time.
SKEW = {WORKERS[1]: -0.4, WORKERS[2]: 0.3}
PLACES = [f"memory@{w}" for w in WORKERS] + [f"disk@{WORKERS[0]}", "file@host:/tmp/x",
                                                  "client"]


class Workflow:
    """A plausible run of events with mistakes mixed in, drawn step by step."""

    def __init__(self, draw) -> None:
        self.draw = draw
        self.events: list[tuple] = []
        self.held: dict[str, set[str]] = {}
        self.computed: list[str] = []
        self.clock = 100.0

    def tick(self, place: str = "") -> tuple[float, float]:
        """A start and stop, on the clock of the worker of ``place`` (they disagree)."""
        start = self.clock
        self.clock += self.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]))
        skew = SKEW.get(place.rpartition("@")[2] or place, 0.0)
        return start + skew, self.clock + skew

    def compute(self) -> None:
        draw = self.draw
        if self.computed and draw(st.integers(0, 9)) == 0:
            key = draw(st.sampled_from(self.computed))  # computed again
        else:
            key = f"('task-{draw(st.sampled_from('abc'))}', {len(self.computed)})"
        worker = draw(st.sampled_from(WORKERS))
        memory = f"memory@{worker}"
        inputs = draw(st.lists(st.sampled_from(self.computed), max_size=3)) if (
            self.computed) else []
        for name in inputs:
            places = self.held.get(name)
            if places and memory not in places and draw(st.integers(0, 4)):
                self.transfer(name, draw(st.sampled_from(sorted(places))), memory)
        start, stop = self.tick(worker)
        rare = draw(st.integers(0, 19))
        self.events.append((
            "compute", key, worker, draw(st.sampled_from([7, 8, None])), start, stop,
            draw(st.integers(0, 1000)), tuple(inputs), draw(st.sampled_from([0, 1, 99, None])),
            draw(st.sampled_from([None, "task", "other", f"new{len(self.events) % 4}"])),
            draw(st.sampled_from([None, None, None, "group"])),
            "CONVERT" if rare == 1 else None, f"disk@{worker}" if rare == 2 else None,
            draw(st.sampled_from([None, None, None, "erred", "origin-x"])),
            (draw(st.sampled_from(self.computed)),) if rare == 3 and self.computed else None,
            *draw(st.sampled_from([
                (), (start - 0.5, None, start - 0.25), (None, None, None, None, None),
                (start - 0.5, start - 0.4, start - 0.4,
                 self.computed[-1] if self.computed else "nobody", worker)])),
        ))
        self.computed.append(key)
        self.held.setdefault(key, set()).add(memory)

    def transfer(self, key: str, source: str, target: str) -> None:
        start, stop = self.tick(target)
        nbytes = self.draw(st.sampled_from([None, 10, 2000]))
        self.events.append(("transfer", key, source, target, start, stop, nbytes,
                            *self.draw(st.sampled_from([(), (None,), (start - 0.1,)]))))
        self.held.setdefault(key, set()).add(target)

    def step(self) -> None:
        draw = self.draw
        action = draw(st.sampled_from(
            ["compute"] * 6 + ["transfer", "delete", "delete", "root", "wrong", "odd"]))
        if action == "compute" or not self.computed:
            self.compute()
        elif action == "transfer":
            key = draw(st.sampled_from(self.computed))
            places = sorted(self.held.get(key) or PLACES[:1])
            self.transfer(key, draw(st.sampled_from(places)), draw(st.sampled_from(PLACES)))
        elif action == "delete":
            key = draw(st.sampled_from(self.computed))
            places = sorted(self.held.get(key) or PLACES[:1])
            place = draw(st.sampled_from(places))
            self.events.append(("delete", key, place, self.tick()[1]))
            self.held.get(key, set()).discard(place)
        elif action == "root":
            self.events.append(("root", self.tick()[1], "graph"))
        elif action == "wrong":  # malformed: both paths must refuse it alike
            self.events.append(draw(st.sampled_from([
                ("compute", "bad", WORKERS[0], 1, "soon", 1.0, 5, (), 0, None, None, None,
                 None, None, None),
                ("transfer", "x", PLACES[0]),
                ("delete", "x", PLACES[0], None),
                ("nothing",),
            ])))
        else:  # odd but valid values
            start, stop = self.tick()
            self.events.append(draw(st.sampled_from([
                ("compute", f"odd-{len(self.events)}", WORKERS[1], 2**40, start, stop,
                 True, (), 0, "task", None, None, None, None, ()),
                ("compute", f"nan-{len(self.events)}", WORKERS[2], None, start, math.nan,
                 3, (), 0, "task", None, None, None, None, None),
                ("transfer", self.computed[0], PLACES[0], "memory@tcp://10.0.0.9:1", start,
                 stop, None),
            ])))


@st.composite
def workflows(draw) -> tuple[list[tuple], list[tuple[int, str]]]:
    """Events, and what happens between segments of them: (position, action)."""
    flow = Workflow(draw)
    for _ in range(draw(st.integers(1, 60))):
        flow.step()
    n = len(flow.events)
    breaks = sorted(set(draw(st.lists(st.integers(0, n), max_size=4))))
    return flow.events, [(at, draw(st.sampled_from(["resolve", "resolve-old", "lose", ""])))
                         for at in breaks]


def over_the_wire(events: list[tuple]) -> EventColumns:
    """The columns a receiver decodes; a batch the codec refuses is applied as encoded."""
    try:
        return decode_batch(encode_batch(events, columns=True)).columns
    except BatchError:
        return EventColumns.from_events(events)


def run(events, breaks, how: str) -> tuple[PAGBuilder, list[tuple]]:
    """Apply ``events`` one by one, as tuples in windows, or as columns decoded off the wire.

    Returns the builder, and what was seen on the way: each refused event, and
    the graph's end after each segment.
    """
    builder = PAGBuilder(run_id="same", max_released=7)
    seen: list[tuple] = []
    position = 0
    for at, action in [*breaks, (len(events), "")]:
        segment = events[position:at]
        now = float(at)
        if how == "one by one":
            for event in segment:
                try:
                    builder.apply(event, now)
                except Exception:
                    seen.append(event)
        else:  # windows from one event on, so that short sequences take them too
            saved = feed_module.COLUMNS_FROM, feed_module.WINDOW_MAX
            feed_module.COLUMNS_FROM = 1
            try:
                if how == "tuples":  # and tuples in pieces of 5, to cross their bounds
                    feed_module.WINDOW_MAX = 5
                    builder.apply_many(segment, now, on_error=lambda e, _: seen.append(e))
                else:
                    builder.apply_columns(over_the_wire(segment), now,
                                          on_error=lambda e, _: seen.append(e))
            finally:
                feed_module.COLUMNS_FROM, feed_module.WINDOW_MAX = saved
        position = at
        seen.append(("end after the segment", builder.end, builder.ends.latest))
        if action == "resolve":
            builder.resolve_parked()
        elif action == "resolve-old":
            builder.resolve_parked(older_than=now - 1)
        elif action == "lose":
            builder.lose(WORKERS[0], 1e4 + at)
    return builder, seen


def state_of(builder: PAGBuilder) -> dict:
    """Everything the builder holds, comparable (NaN equal to NaN)."""
    store = builder.store
    found = {name: [("nan" if isinstance(v, float) and math.isnan(v) else v) for v in value]
             for name, value in vars(store).items() if isinstance(value, array)}
    for table in ("keys", "labels", "locations", "workers"):
        found[table] = list(getattr(store, table).values)
    found["live"] = dict(builder.holdings.newest)
    found["copies"] = {k: list(v.items()) for k, v in builder.holdings.others.items()}
    found["fanout"] = dict(builder.fanout.seen)
    found["parked"] = {slot: [parse(e) for e in events]  # records or the tuples given
                       for slot, events in builder.waiting.events.items()}
    found["parked_at"] = dict(builder.waiting.since)
    for name in ("end", "n_applied", "n_parked_total", "n_fallbacks", "n_lost", "run_root",
                 "roots"):
        found[name] = getattr(builder, name)
    found["latest"] = builder.ends.latest
    found["threads"] = dict(builder.threads.last)
    found["released"] = {(key, place): builder.holdings.released_at(key, code)
                         for key in set(store.keys.values)
                         for place, code in store.locations.codes.items()}
    return found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workflows())
def test_windows_build_exactly_what_one_by_one_builds(flow):
    events, breaks = flow
    scalar, scalar_seen = run(events, breaks, "one by one")
    expected = state_of(scalar)
    for how in ("tuples", "columns"):
        windowed, windowed_seen = run(events, breaks, how)
        assert windowed_seen == scalar_seen, how
        got = state_of(windowed)
        for name in expected:
            assert got[name] == expected[name], (how, name)


def test_a_routine_run_goes_almost_entirely_through_windows():
    rng = random.Random(3)
    events: list[tuple] = [("root", 0.0, "graph")]
    clock = 1.0
    previous: list[tuple[str, str]] = []
    held: dict[str, set[str]] = {}
    last_on: dict[str, str] = {}
    for layer in range(40):
        current = []
        for i in range(100):
            worker = WORKERS[i % 3]
            inputs = []
            # Every fourth task has no inputs: a root task the scheduler queued, sent
            # when the task before it on its worker freed the slot.
            queued = i % 4 == 0 and worker in last_on
            for key, where in rng.sample(previous, 0 if queued else min(2, len(previous))):
                if worker not in held[key]:
                    clock += 0.001
                    events.append(("transfer", key, f"memory@{where}", f"memory@{worker}",
                                   clock - 0.0005, clock, 64))
                    held[key].add(worker)
                inputs.append(key)
            clock += 0.001
            key = f"('layer{layer}', {i})"
            events.append(("compute", key, worker, 1, clock - 0.001, clock, 64, tuple(inputs),
                           0, f"layer{layer}", None, None, None, None, None,
                           clock - 0.002, clock - 0.0015, clock - 0.0015,
                           *((last_on[worker], worker) if queued else ())))
            current.append((key, worker))
            last_on[worker] = key
            held[key] = {worker}
        for key, _ in previous:
            for worker in sorted(held.pop(key)):
                events.append(("delete", key, f"memory@{worker}", clock))
        previous = current

    scalar_calls = []
    windowed = PAGBuilder(run_id="same")
    for kind, handler in list(windowed._dispatch.items()):
        windowed._dispatch[kind] = (
            lambda event, now=0.0, h=handler: scalar_calls.append(event[0]) or h(event, now))
    windowed.apply_many(events)
    scalar = PAGBuilder(run_id="same")
    for event in events:
        scalar.apply(event)
    assert state_of(windowed) == state_of(scalar)
    assert (windowed.pag().causes["kind"] == "SLOT").sum() > 900
    # Only the root, the tail shorter than a window, and window breaks go one by one.
    assert len(scalar_calls) < 0.05 * len(events), len(scalar_calls)
    assert windowed.store.n_states > 6000


def test_a_stream_of_waiting_events_is_not_planned_event_after_event(monkeypatch):
    # Every computation reads an input that another worker reports only at the
    # end (as a worker's late batch does): no window can take any of them.
    n = 4000
    events = [("compute", f"c-{i}", WORKERS[0], 1, float(i), i + 0.5, 8, (f"in-{i}",), 0,
               None, None, None, None, None, None) for i in range(n)]
    events += [("transfer", f"in-{i}", f"memory@{WORKERS[1]}", f"memory@{WORKERS[0]}",
                i - 0.2, i - 0.1, 8) for i in range(n)]
    planned = []
    real = feed_module.apply_window
    monkeypatch.setattr(feed_module, "apply_window",
                        lambda *args: planned.append(args[3] - args[2]) or real(*args))
    windowed = PAGBuilder(run_id="same")
    windowed.apply_columns(EventColumns.from_events(events[:n]))
    # Each window that takes nothing is followed by a pause that doubles.
    assert len(planned) <= 8, planned
    windowed.apply_columns(EventColumns.from_events(events[n:]))
    scalar = PAGBuilder(run_id="same")
    for event in events:
        scalar.apply(event)
    assert state_of(windowed) == state_of(scalar)

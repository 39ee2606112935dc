"""The journal: steps written as flushed, read back in order, a torn last step skipped."""

from __future__ import annotations

import pickle

import pytest
from click.testing import CliRunner

from crux_dask.cli import main
from crux_dask.plugins.journal import Clocks, Journal, journals


def test_steps_read_back_in_order_after_the_snapshot_they_follow(tmp_path):
    journal = Journal(str(tmp_path), "run")
    assert journal.load() is None
    journal.snapshot({"state": 0})
    journal.add("take", b"one", [1.0])
    journal.add("slice", b"", [2.0, 3.0])
    assert journal.flush() and not journal.flush()
    journal.add("resolve", pickle.dumps(True), [])
    journal.flush()
    journal.close()
    state, steps = Journal(str(tmp_path), "run").load()
    assert state == {"state": 0}
    assert list(steps) == [("take", b"one", [1.0]), ("slice", b"", [2.0, 3.0]),
                           ("resolve", pickle.dumps(True), [])]
    assert journals(str(tmp_path)) == [tmp_path / "journal" / "run"]


def test_a_new_generation_removes_the_one_before(tmp_path):
    journal = Journal(str(tmp_path), "run")
    journal.snapshot("first")
    journal.add("take", b"x", [])
    journal.snapshot("second")  # what was kept is written to the first, then it goes
    journal.add("slice", b"", [])
    journal.close()
    assert sorted(p.name for p in journal.path.iterdir()) == ["000001.arrow", "000001.snapshot"]
    state, steps = Journal(str(tmp_path), "run").load()
    assert (state, list(steps)) == ("second", [("slice", b"", [])])


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_step_torn_by_a_killed_writer_is_skipped_and_those_before_are_read(tmp_path, cut):
    journal = Journal(str(tmp_path), "run")
    journal.snapshot(None)
    for number in range(3):
        journal.add("take", bytes([number]) * 100, [float(number)])
        journal.flush()
    stream = journal.path / "000000.arrow"
    whole = stream.stat().st_size  # the writer is killed as it writes the third step
    journal.close()
    stream.write_bytes(stream.read_bytes()[:whole - cut])
    _, steps = Journal(str(tmp_path), "run").load()
    assert [step[1][:1] for step in steps] == [b"\x00", b"\x01"]


def test_a_journal_without_a_snapshot_is_not_one(tmp_path):
    (tmp_path / "journal" / "run").mkdir(parents=True)
    (tmp_path / "journal" / "run" / "000000.partial").write_bytes(b"half a pickle")
    assert Journal(str(tmp_path), "run").load() is None
    assert journals(str(tmp_path)) == []


def test_clocks_play_back_what_they_read():
    clocks = Clocks()
    read = [clocks.monotonic(), clocks.wall()]
    assert clocks.take() == read and clocks.take() == []
    clocks.play(read)
    assert [clocks.monotonic(), clocks.wall()] == read
    with pytest.raises(RuntimeError, match="more often"):
        clocks.monotonic()
    clocks.play(None)
    assert clocks.monotonic() > read[0]


def test_recover_says_what_it_could_not_read_and_fails(tmp_path):
    runner = CliRunner()
    empty = runner.invoke(main, ["recover", str(tmp_path), str(tmp_path / "out")])
    assert empty.exit_code == 2 and "no journal" in empty.output
    journal = Journal(str(tmp_path), "run")
    journal.snapshot("not an engine")  # a snapshot, but of nothing recoverable
    journal.close()
    damaged = runner.invoke(main, ["recover", str(tmp_path), str(tmp_path / "out")])
    assert damaged.exit_code == 2
    assert "could not recover the journal" in damaged.output
    assert not (tmp_path / "out").exists()

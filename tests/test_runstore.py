"""The run-keyed store: identity checks, resume, torn and doubled parts, kill -9 at any moment."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kdalab.records import RunStore, StoreError, identity
from kdalab.records import writer as runstore

SCHEMA = pa.schema([("run", pa.int64()), ("name", pa.string()), ("value", pa.float64())])
RUNS = 40
PER_RUN = 2


def records(runs) -> pa.Table:
    """Two records per run, a pure function of the run."""
    runs = np.repeat(np.asarray(runs, dtype=np.int64), PER_RUN)
    names = [f"r{r}-{i % PER_RUN}" for i, r in enumerate(runs)]
    return pa.table({"run": runs, "name": names, "value": np.sqrt(runs + 0.5)}, schema=SCHEMA)


def open_store(folder, config=None, **kw) -> RunStore:
    return RunStore.open(folder, kind="test", config=config or {"a": 1}, runs=RUNS,
                         records_per_run=PER_RUN, schema=SCHEMA, **kw)


def fill(store: RunStore, runs, batch=7) -> None:
    runs = [r for r in runs if not store.done[r]]
    for i in range(0, len(runs), batch):
        chunk = runs[i : i + batch]
        store.append(records(chunk), group=f"g{chunk[0] // 20}")


def test_records_come_back_in_run_order(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, list(reversed(range(RUNS))), batch=3)
    back = RunStore.read_only(tmp_path)
    assert back.complete and back.groups() == ["g0", "g1"]
    assert back.read().equals(records(range(RUNS)))
    assert back.read(["value"]).column_names == ["value"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["runs"] == RUNS and manifest["fingerprint"].startswith("sha256:")
    assert manifest["kdalab_version"] == identity.kdalab_version()


def test_groups_read_ahead_come_back_as_read_one_by_one(tmp_path):
    """iter_groups reads the next groups on threads: the same groups, in order, with the same
    records as one at a time, also with the last records still buffered, and when the
    reader stops early."""
    with open_store(tmp_path) as store:
        for i in range(0, RUNS, 3):  # a group per three runs: 14 groups, several parts each
            store.append(records(range(i, min(i + 3, RUNS))), group=f"g{i // 3:02d}")
            if i % 9 == 0:
                store.flush()
        one_by_one = [(g, t) for g, t in store.iter_groups(ahead=0)]
        assert len(one_by_one) == 14
        for ahead in (1, 3, 8, 32):
            got = list(store.iter_groups(ahead=ahead))
            assert [g for g, _ in got] == [g for g, _ in one_by_one]
            assert all(a.equals(b) for (_, a), (_, b) in zip(got, one_by_one))
        assert [g for g, _ in store.iter_groups(["value"], ahead=4)] == store.groups()
        early = store.iter_groups(ahead=4)
        assert next(early)[0] == "g00"
        early.close()  # the threads' reads are waited for, nothing is left running
    assert not [t for t in threading.enumerate() if t.name.startswith("kdalab-read")]


def test_resume_keeps_stored_runs_and_completes(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(15))
    with pytest.raises(StoreError, match="already holds 15 of 40 runs.*--resume"):
        open_store(tmp_path)
    with open_store(tmp_path, resume=True) as store:
        assert int(store.done.sum()) == 15
        fill(store, range(RUNS))
    assert RunStore.read_only(tmp_path).read().equals(records(range(RUNS)))


def test_a_different_sweep_or_foreign_folder_is_refused(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(5))
    with pytest.raises(StoreError, match="holds other records .*--force"):
        open_store(tmp_path, config={"a": 2}, resume=True)
    with open_store(tmp_path, config={"a": 2}, force=True) as store:
        assert not store.done.any()
        assert not list((tmp_path / "parts").glob("*.parquet"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not empty and holds no kdalab store"):
        open_store(foreign)
    (foreign / "records.json").write_text("[]")  # an earlier kdalab version's records
    open_store(foreign, force=True).close()
    assert (foreign / "notes.txt").exists() and not (foreign / "records.json").exists()
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        open_store(afile)


def test_another_kdalab_version_resumes_and_another_numerics_version_is_refused(
        tmp_path, monkeypatch):
    """The package version changes with every commit: a pull must not break a resume. The
    numerics version is what decides: another one is refused (its numbers differ)."""
    with open_store(tmp_path) as store:
        fill(store, range(5))
    assert json.loads((tmp_path / "manifest.json").read_text())["numerics"] == \
        identity.NUMERICS_VERSION
    monkeypatch.setattr(identity, "kdalab_version", lambda: "9.9.9")
    with open_store(tmp_path, resume=True) as store:  # a newer kdalab, the same numbers
        assert int(store.done.sum()) == 5
        fill(store, range(5, 8))
    monkeypatch.setattr(identity, "NUMERICS_VERSION", identity.NUMERICS_VERSION + 1)
    with pytest.raises(StoreError, match=f"numerics version {identity.NUMERICS_VERSION - 1} "
                                         f".*this kdalab computes version "
                                         f"{identity.NUMERICS_VERSION}.*--force"):
        open_store(tmp_path, resume=True)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["numerics"]  # a store written before numerics versions
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="before numerics versions"):
        open_store(tmp_path, resume=True)


def test_one_writer_at_a_time(tmp_path):
    with open_store(tmp_path):
        with pytest.raises(StoreError, match="another kdalab process"):
            open_store(tmp_path, resume=True)
    open_store(tmp_path, resume=True).close()  # released


def test_torn_doubled_and_unfinished_parts_are_dropped(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(RUNS), batch=5)
        store.flush()
    parts = sorted((tmp_path / "parts").glob("*.parquet"))
    assert len(parts) == 2  # one per group: appends are buffered into parts
    torn = parts[-1]
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # cut mid-file
    twin = tmp_path / "parts" / "g0-000099.parquet"
    twin.write_bytes(parts[0].read_bytes())  # the same runs twice
    (tmp_path / "parts" / ".g1-000100.parquet.tmp").write_bytes(b"PAR1")  # an unfinished part
    view = RunStore.read_only(tmp_path)
    assert not view.complete and sorted(view.dropped) == sorted([torn.name, twin.name])
    with open_store(tmp_path, resume=True) as store:
        assert int(store.done.sum()) == 20 and not torn.exists() and not twin.exists()
        assert not list((tmp_path / "parts").glob(".*.tmp"))
        fill(store, range(RUNS))
    assert RunStore.read_only(tmp_path).read().equals(records(range(RUNS)))


def test_appending_a_stored_run_again_is_an_error(tmp_path):
    with open_store(tmp_path) as store:
        store.append(records([1, 2]), "g0")
        with pytest.raises(ValueError, match="already stored"):
            store.append(records([2]), "g0")
        with pytest.raises(ValueError, match="schema"):
            store.append(records([3]).drop_columns(["name"]), "g0")


def test_views_are_tracked_and_replaced(tmp_path):
    with open_store(tmp_path) as store:
        fill(store, range(RUNS))
        old = tmp_path / "old_table.md"
        old.write_text("old")
        store.set_views([old])
    with open_store(tmp_path, resume=True) as store:
        assert store.manifest.views == ["old_table.md"]
        store.remove_views()
        assert not old.exists()



def test_parts_are_written_off_the_caller_at_most_four_at_once_and_flush_waits(tmp_path,
                                                                              monkeypatch):
    """The writer thread writes parts while the caller goes on; with PARTS_WRITING parts in
    its hands the next append waits for one; flush returns once every record is on disk."""
    real, gate = runstore._write_part, threading.Event()

    def held(parts_dir, name, table):
        assert gate.wait(30)
        return real(parts_dir, name, table)

    monkeypatch.setattr(runstore, "_write_part", held)
    monkeypatch.setattr(runstore, "PART_ROWS", PER_RUN)  # a part per run appended
    parts = tmp_path / "parts"
    store = open_store(tmp_path)
    for run in range(runstore.PARTS_WRITING):
        store.append(records([run]), "g0")  # returns at once: the writer holds the parts
    assert not list(parts.glob("*.parquet")) and store.done[: runstore.PARTS_WRITING].all()
    fifth = threading.Thread(target=store.append, args=(records([9]), "g0"))
    fifth.start()
    fifth.join(0.3)
    assert fifth.is_alive()  # waits for the writer: at most PARTS_WRITING parts in hand
    gate.set()
    fifth.join(30)
    store.append(records([10, 11]), "g0")
    store.flush()
    assert len(list(parts.glob("*.parquet"))) == runstore.PARTS_WRITING + 2
    assert not list(parts.glob(".*.tmp"))
    assert RunStore.read_only(tmp_path).read().equals(records([0, 1, 2, 3, 9, 10, 11]))
    store.close()


def test_an_interrupted_writer_keeps_every_appended_record(tmp_path, monkeypatch):
    """An exception (here ^C) in the caller while parts are still being written: closing the
    store writes and waits for every record appended."""
    real = runstore._write_part

    def slow(parts_dir, name, table):
        time.sleep(0.02)
        return real(parts_dir, name, table)

    monkeypatch.setattr(runstore, "_write_part", slow)
    monkeypatch.setattr(runstore, "PART_ROWS", 4)
    with pytest.raises(KeyboardInterrupt):
        with open_store(tmp_path) as store:
            fill(store, range(25), batch=3)
            raise KeyboardInterrupt
    back = RunStore.read_only(tmp_path)
    assert int(back.done.sum()) == 25 and back.read().equals(records(range(25)))
    with open_store(tmp_path, resume=True) as store:
        fill(store, range(RUNS))
    assert RunStore.read_only(tmp_path).read().equals(records(range(RUNS)))


def test_an_interrupt_inside_a_hand_off_loses_no_record(tmp_path, monkeypatch):
    """^C raises wherever the caller is, also while a group's buffer is being made a part
    (CI once stored 384 runs of the 576 the interrupted sweep counted): the buffer is kept
    for close, and every appended run is on disk, as many as the store counted."""
    real = pa.concat_tables
    calls = []

    def interrupted(tables, *a, **kw):
        calls.append(len(tables))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(tables, *a, **kw)

    monkeypatch.setattr(runstore.pa, "concat_tables", interrupted)
    monkeypatch.setattr(runstore, "PART_ROWS", 4)
    with pytest.raises(KeyboardInterrupt):
        with open_store(tmp_path) as store:
            fill(store, range(25), batch=3)
    counted = int(store.done.sum())
    back = RunStore.read_only(tmp_path)
    assert counted == 6 and int(back.done.sum()) == counted
    assert back.read().equals(records(range(6)))


def test_a_failed_part_write_raises_in_the_caller_and_resume_completes(tmp_path, monkeypatch):
    """A part the writer thread fails to write (a full disk) raises in the caller, at its
    next append, or at flush or close; the store is released, keeps the parts written, and a
    resume computes the lost runs again."""
    real, calls = runstore._write_part, []

    def failing(parts_dir, name, table):
        calls.append(name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(parts_dir, name, table)

    monkeypatch.setattr(runstore, "_write_part", failing)
    monkeypatch.setattr(runstore, "PART_ROWS", 3 * PER_RUN)  # a part per append of 3 runs
    with pytest.raises(OSError, match="No space left"):
        with open_store(tmp_path) as store:
            fill(store, range(RUNS), batch=3)
    with open_store(tmp_path, resume=True) as store:
        kept = np.flatnonzero(store.done).tolist()  # what was appended, but the lost part
        assert kept[:3] == [0, 1, 2] and kept[3:] == list(range(6, kept[-1] + 1))
        fill(store, range(RUNS))
    assert RunStore.read_only(tmp_path).read().equals(records(range(RUNS)))
    # the last write fails: flush (and close, which releases the store) raise it
    calls.clear()
    monkeypatch.setattr(runstore, "PART_ROWS", 10 * RUNS)
    with open_store(tmp_path / "other") as store:
        store.append(records([0]), "g0")
        store.append(records([1]), "g1")
        with pytest.raises(OSError, match="No space left"):
            store.flush()
    with open_store(tmp_path / "other", resume=True) as store:
        assert store.done[:2].tolist() == [True, False]

WRITER = r"""
import sys, time, numpy as np
sys.path.insert(0, {tests!r})
from kdalab.records import writer as runstore
from test_runstore import open_store, records, RUNS
runstore.PART_ROWS = 6          # many small parts: many moments to be killed in
with open_store({folder!r}, resume=True) as store:
    todo = [r for r in range(RUNS) if not store.done[r]]
    for i in range(0, len(todo), 3):
        time.sleep(0.01)
        store.append(records(todo[i : i + 3]), group=f"g{{todo[i] // 20}}")
print("finished")
"""


def test_kill_9_at_any_moment_then_resume_gives_exactly_the_records(tmp_path):
    """A writer process killed with SIGKILL at random moments, resumed each time, ends with
    exactly the records of an uninterrupted run: none lost, none doubled."""
    folder = tmp_path / "store"
    script = WRITER.format(tests=str(Path(__file__).parent), folder=str(folder))
    rng = np.random.default_rng(0)
    progress = []
    for attempt in range(12):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        if attempt < 8:  # killed somewhere between its start and its end, then resumed
            target = int(rng.integers(0, 6))  # after this many more parts, at a random moment
            seen = len(list(folder.glob("parts/*")))
            while proc.poll() is None and len(list(folder.glob("parts/*"))) < seen + target:
                time.sleep(0.002)
            time.sleep(float(rng.uniform(0, 0.03)))
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        if "finished" in out:
            break
        assert proc.returncode == -signal.SIGKILL, err
        if (folder / "manifest.json").exists():
            progress.append(int(RunStore.read_only(folder).done.sum()))
    assert "finished" in out
    assert any(0 < p < RUNS for p in progress), progress  # some kills hit mid-sweep
    store = RunStore.read_only(folder)
    assert store.complete
    assert store.read().equals(records(range(RUNS)))
    # the parts together hold each run's records once
    runs = np.concatenate([pq.read_table(p, columns=["run"]).column(0).to_numpy()
                           for ps in store.parts.values() for p in ps])
    assert sorted(runs.tolist()) == sorted(np.repeat(np.arange(RUNS), PER_RUN).tolist())


def test_identical_compares_bits():
    from kdalab.records import identical

    t = pa.table({"run": [0, 1], "x": [float("nan"), 0.0]})
    assert identical(t, pa.table({"run": [0, 1], "x": [float("nan"), 0.0]}))
    assert not t.equals(t)  # Arrow's own equality: NaN ≠ NaN
    assert not identical(t, pa.table({"run": [0, 1], "x": [float("nan"), -0.0]}))
    assert not identical(t, pa.table({"run": [0, 1], "x": [None, 0.0]}))

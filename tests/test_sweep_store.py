"""`kdalab sweep` into its store: refusals, resume, redraw, a process killed with SIGKILL
mid-sweep, and the Ray backend (same records bit for bit, a worker killed mid-sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from kdalab.cli import main
from kdalab.records import RunStore, identical
from kdalab.runner import open_store, run_into_store
from kdalab.studies.sweep import SweepConfig, SweepPlan, iter_batch_tables


class Result:
    def __init__(self, code, output):
        self.exit_code, self.output = code, output


class Runner:
    """The command line in this process, through its error boundary (as `kdalab` runs it)."""

    def invoke(self, _app, args) -> Result:  # CliRunner's signature
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as done:
                code = done.code
        return Result(code, out.getvalue() + err.getvalue())


runner, app = Runner(), None
AXES = ["--families", "floor,weak_decay_correlated,model_like", "--chunks", "3,8,17",
        "--seeds", "0-4", "--dims", "16", "--accumulation", "fp16-seq,h200"]


def sweep(*args):
    return runner.invoke(app, ["sweep", *AXES, "--quiet", *args])


def said(result) -> str:
    """The command's output as one line (the terminal wraps long messages)."""
    return " ".join(result.output.split())


def stored(folder) -> object:
    store = RunStore.read_only(folder)
    assert store.complete
    return store.read()


def test_a_store_is_never_overwritten_silently(tmp_path):
    out = str(tmp_path / "s")
    assert sweep("--out", out).exit_code == 0
    first = stored(out)
    assert len(first) == 3 * 5 * 3 * 2  # runs × accumulation models
    again = sweep("--out", out)
    assert again.exit_code == 2 and "already holds 45 of 45 runs" in said(again)
    other = runner.invoke(app, ["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8",
                                "--out", out, "--quiet"])
    assert other.exit_code == 2 and "holds other records" in said(other)
    assert "--force" in said(other) and identical(stored(out), first)
    assert runner.invoke(app, ["sweep", "--chunks", "4", "--seeds", "0", "--dims", "8",
                               "--out", out, "--quiet", "--force"]).exit_code == 0
    assert len(stored(out)) == 3  # replaced whole: the old tables went with the old records
    assert not (Path(out) / "exponent_boundary_fp16-seq_d16_lb-5.md").exists()


def test_resume_without_options_continues_the_stored_sweep(tmp_path):
    out = tmp_path / "s"
    cfg = SweepConfig.parse({"families": "floor,model_like", "chunks": "3,17", "seeds": "0-4",
                             "dims": "16", "accumulations": "fp16-seq"})
    plan = SweepPlan.of(cfg)
    with open_store(plan, out) as store:  # a sweep that stopped after its first two batches
        batches = iter_batch_tables(plan.batches(3), plan.accumulations, recipe=plan.recipe,
                                    device=torch.device("cpu"))
        for batch, table in islice(batches, 2):
            store.append(table, batch.group)
    assert int(RunStore.read_only(out).done.sum()) == 6
    res = runner.invoke(app, ["sweep", "--out", str(out), "--resume", "--quiet"])
    assert res.exit_code == 0, res.output
    whole = tmp_path / "whole"
    assert runner.invoke(app, ["sweep", "--families", "floor,model_like", "--chunks", "3,17",
                               "--seeds", "0-4", "--dims", "16", "--out", str(whole),
                               "--quiet"]).exit_code == 0
    assert identical(stored(out), stored(whole))


def test_summarize_store_reads_groups_in_runs_and_gives_the_summary_of_all(tmp_path,
                                                                           monkeypatch):
    from kdalab.studies import aggregate

    cfg = SweepConfig.parse({"families": "floor,model_like", "chunks": "2,3,8", "seeds": "0-3",
                             "dims": "16", "accumulations": "fp16-seq,fp32"})
    plan = SweepPlan.of(cfg)
    with open_store(plan, tmp_path / "s") as store:
        run_into_store(plan, store)
    store = RunStore.read_only(tmp_path / "s")
    want = aggregate.summarize(store.read().to_pandas())
    for rows in (1, 20, 1 << 20):  # a summary per group, per few groups, of all at once
        monkeypatch.setattr(aggregate, "SUMMARY_ROWS", rows)
        got = aggregate.summarize_store(store)
        assert got.equals(want) and len(got) == 2 * 3 * 2

def test_redraw_replaces_the_views_from_the_stored_records(tmp_path):
    out = tmp_path / "s"
    assert sweep("--out", str(out)).exit_code == 0
    table = out / "exponent_boundary_fp16-seq_d16_lb-5.md"
    before = table.read_text()
    table.write_text("stale")
    res = runner.invoke(app, ["sweep", "--redraw", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert table.read_text() == before and (out / "records.json").exists()
    assert "Exponent boundary" in res.output
    bad = runner.invoke(app, ["sweep", "--redraw", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "holds no kdalab store" in said(bad)


KILLABLE = ("import sys; from kdalab.records import writer; writer.PART_SECONDS = 0.02; "
            "from kdalab.cli import main; sys.argv[0] = 'kdalab'; main()")


def test_kill_9_mid_sweep_then_resume_gives_the_uninterrupted_records(tmp_path):
    """`kdalab sweep` in a subprocess killed with SIGKILL after a random number of new parts
    (parts written every 20 ms here), resumed each time with --resume: the final store holds
    exactly the records of an uninterrupted sweep, none lost and none doubled."""
    out = tmp_path / "killed"
    axes = ["--families", "floor,weak_decay_correlated,model_like", "--chunks", "2-24",
            "--seeds", "0-5", "--dims", "32", "--accumulation", "fp16-seq"]
    rng = np.random.default_rng(1)
    progress = []
    for attempt in range(8):
        args = [sys.executable, "-c", KILLABLE, "sweep", *axes, "--out", str(out), "--quiet"]
        proc = subprocess.Popen(args + (["--resume"] if attempt else []),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if attempt < 3:
            target = int(rng.integers(1, 6))
            seen = len(list(out.glob("parts/*")))
            while proc.poll() is None and len(list(out.glob("parts/*"))) < seen + target:
                time.sleep(0.005)
            time.sleep(float(rng.uniform(0, 0.02)))
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, err
        progress.append(int(RunStore.read_only(out).done.sum()))
    assert proc.returncode == 0, err
    total = 23 * 3 * 6
    assert any(0 < p < total for p in progress), progress
    whole = tmp_path / "whole"
    assert runner.invoke(app, ["sweep", *axes, "--out", str(whole), "--quiet"]).exit_code == 0
    assert identical(stored(out), stored(whole))


def test_ray_backend_stores_the_local_records_bit_for_bit(local_ray, tmp_path):
    assert sweep("--out", str(tmp_path / "local")).exit_code == 0
    res = sweep("--out", str(tmp_path / "ray"), "--backend", "ray")
    assert res.exit_code == 0, res.output
    assert identical(stored(tmp_path / "ray"), stored(tmp_path / "local"))


def _ray_task_pids() -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(b"ray::KdalabWorker.run"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass
    return pids


def test_ray_worker_killed_mid_sweep_is_retried(local_ray, tmp_path):
    """A Ray worker running a shard is killed with SIGKILL: Ray reruns the shard, and the store
    ends with the local backend's records, none lost or doubled."""
    cfg = SweepConfig.parse({"families": "floor,model_like", "chunks": "2-24", "seeds": "0-9",
                             "dims": "32", "accumulations": "h200"})
    plan = SweepPlan.of(cfg)
    killed: list[int] = []

    def killer():
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            pids = _ray_task_pids()
            if pids:
                time.sleep(0.05)
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    with open_store(plan, tmp_path / "ray") as store:
        run_into_store(plan, store, backend="ray", max_batch=20)
    thread.join()
    assert killed, "no Ray task was running to be killed"
    with open_store(plan, tmp_path / "local") as store:
        run_into_store(plan, store)
    assert identical(stored(tmp_path / "ray"), stored(tmp_path / "local"))


def test_joining_a_ray_cluster_checks_its_gpus_not_this_machines(local_ray, tmp_path):
    """--device cuda with --address: the GPUs must be the cluster's (this driver may have none);
    a cluster without GPUs is a one-line error."""
    address = local_ray.get_runtime_context().gcs_address
    res = sweep("--out", str(tmp_path / "s"), "--backend", "ray", "--address", address,
                "--device", "cuda")
    assert res.exit_code == 2 and "has no GPU to run on" in said(res), res.output

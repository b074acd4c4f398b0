"""Helper processes (kdalab.experiments.helper): the draw servers and the views worker change
when work is done, never what — the same records and the same files as without them, also when
a helper dies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdalab.experiments import helper
from kdalab.experiments.helper import DRAW_SERVER, Helper, HelperError
from kdalab.experiments.sweep import SweepConfig, SweepPlan

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="helpers' shared memory: Linux")

SRC = str(Path(__file__).parents[1] / "src")
ENV = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _tables(plan: SweepPlan, servers=None) -> list:
    import torch

    from kdalab.experiments.sweep import iter_batch_tables

    batches = list(plan.batches(7))
    return [(b.group, t) for b, t in iter_batch_tables(
        batches, plan.accumulations, recipe=plan.recipe, device=torch.device("cpu"),
        servers=servers)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(ga == gb and ta.equals(tb) for (ga, ta), (gb, tb) in zip(a, b))


@pytest.fixture
def pipelined(monkeypatch):
    """The CUDA pipeline (and so the draw servers) on the CPU."""
    import kdalab.experiments.sweep as sweep

    monkeypatch.setattr(sweep, "_pipelined", lambda device: True)


def _plan() -> SweepPlan:
    return SweepPlan.of(SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                                    chunks=(3, 16, 17), seeds="0-6", dims=(16, 7),
                                    accumulations=("fp16-seq", "fp32")))


def _ready(servers, timeout: float = 120.0):
    """``servers`` once every one has finished its imports."""
    import time

    deadline = time.monotonic() + timeout
    while not servers.ready():
        assert servers.failed is None and time.monotonic() < deadline
        time.sleep(0.05)
    return servers


def test_draw_servers_give_the_records_drawn_here(pipelined):
    from kdalab.experiments.drawserver import DrawServers

    plan = _plan()
    want = _tables(plan)
    servers = _ready(DrawServers([Helper(DRAW_SERVER) for _ in range(2)]))
    try:
        got = _tables(plan, servers)
        assert servers.failed is None
        assert servers.served == len(list(plan.batches(7)))  # every batch by the servers
    finally:
        servers.close()
    assert _same(got, want)


def test_batches_before_the_servers_are_ready_are_drawn_here(pipelined, monkeypatch):
    """Servers still importing: the first batches are drawn in this process, the rest by the
    servers once they are ready, and the records are the same."""
    from kdalab.experiments.drawserver import DrawServers

    plan = _plan()
    want = _tables(plan)
    servers = _ready(DrawServers([Helper(DRAW_SERVER) for _ in range(2)]))
    asked = []
    ready = servers.ready
    monkeypatch.setattr(servers, "ready", lambda: asked.append(1) or (len(asked) > 3 and ready()))
    try:
        got = _tables(plan, servers)
        assert servers.failed is None
        assert servers.served == len(list(plan.batches(7))) - 3
    finally:
        servers.close()
    assert _same(got, want)


def test_a_dead_draw_server_hands_its_draws_back(pipelined):
    """A server killed mid-sweep: the batches from then on are drawn in this process, and the
    records are the same."""
    import torch

    from kdalab.experiments.drawserver import DrawServers
    from kdalab.experiments.sweep import iter_batch_tables

    plan = _plan()
    want = _tables(plan)
    servers = _ready(DrawServers([Helper(DRAW_SERVER) for _ in range(2)]))
    got = []
    try:
        for i, (b, t) in enumerate(iter_batch_tables(
                list(plan.batches(7)), plan.accumulations, recipe=plan.recipe,
                device=torch.device("cpu"), servers=servers)):
            got.append((b.group, t))
            if i == 1:
                servers._helpers[1]._proc.kill()
        assert servers.failed is not None and ("died" in servers.failed or "gone" in servers.failed)
        assert 0 < servers.served < len(got)
    finally:
        servers.close()
    assert _same(got, want)


def test_a_helper_reports_its_failures():
    worker = Helper(DRAW_SERVER)
    try:
        with pytest.raises(HelperError, match="failed:(.|\n)*Traceback"):
            worker.request("no-such-block", 1, 4, 16, 0, ("not", "packed", "runs"))
        # it goes on serving after a failed request
        with pytest.raises(HelperError, match="failed"):
            worker.request()
        assert worker.alive
    finally:
        worker.close()
    assert not worker.alive
    with pytest.raises(HelperError, match="died"):
        Helper("kdalab.no_such_module").request()


def test_the_views_worker_draws_the_files_drawn_here(tmp_path):
    """`kdalab sweep` with its helpers (the views worker) and without (KDALAB_NO_HELPERS=1):
    the same records and the same view files, byte for byte (the SVG too)."""
    args = ["--chunks", "3,16", "--seeds", "0-2", "--accumulation", "fp16-seq,fp32", "--quiet"]
    outs = []
    for env in ({}, {"KDALAB_NO_HELPERS": "1"}):
        out = tmp_path / f"out{len(outs)}"
        res = subprocess.run([sys.executable, "-m", "kdalab", "sweep", *args, "--out", str(out)],
                             env={**ENV, **env}, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        outs.append(out)
    from kdalab.experiments.runstore import RunStore

    a, b = (RunStore.read_only(o) for o in outs)
    assert a.manifest.views == b.manifest.views and len(a.manifest.views) == 15
    for rel in a.manifest.views:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel
    assert a.read().equals(b.read())


def test_a_failing_views_worker_leaves_the_drawing_here(tmp_path, monkeypatch):
    from kdalab.cli.common import draw_views
    from kdalab.experiments.backends import open_store, run_into_store

    plan = SweepPlan.of(SweepConfig(chunks=(4,), seeds="0-1"))
    monkeypatch.setitem(helper._EARLY, helper.VIEWS_WORKER, [Helper("kdalab.no_such_module")])
    with open_store(plan, tmp_path / "s") as store:
        run_into_store(plan, store)
        paths = draw_views(store, show=False)
    assert helper.VIEWS_WORKER not in helper._EARLY
    assert len(paths) == 9 and all(p.exists() for p in paths)


def test_helpers_start_only_where_they_help(monkeypatch):
    import matplotlib  # noqa: F401  (as in a test session: the views are drawn here)

    from kdalab.cli.common import start_helpers

    started = []
    monkeypatch.setattr(helper, "start_early", lambda module, count=1: started.append(module))
    monkeypatch.setenv("KDALAB_NO_HELPERS", "1")
    start_helpers(draw_servers=True)
    assert started == []
    monkeypatch.delenv("KDALAB_NO_HELPERS")
    start_helpers(draw_servers=True)
    assert started == [DRAW_SERVER]


@pytest.mark.gpu
def test_a_cuda_sweep_with_draw_servers_stores_the_records_drawn_here(tmp_path, monkeypatch):
    """The command's path on CUDA: draw servers started early, a sweep above MIN_RUNS into its
    store (the servers awaited, so that they draw every batch), against the same sweep drawn in
    this process (KDALAB_NO_HELPERS's path)."""
    from kdalab.experiments import drawserver
    from kdalab.experiments.backends import open_store, run_into_store
    from kdalab.experiments.runstore import RunStore, identical
    from kdalab.experiments.sweep import DEFAULT_MAX_BATCH

    taken = []
    take = drawserver.take

    def ready_servers(*args):
        servers = take(*args)
        if servers is not None:
            taken.append(_ready(servers))
        return servers

    monkeypatch.setattr(drawserver, "take", ready_servers)

    plan = SweepPlan.of(SweepConfig(families=("floor", "weak_decay_correlated", "model_like"),
                                    chunks="2-8", seeds="0-999", accumulations=("h200",),
                                    device="cuda"))
    assert len(plan) >= drawserver.MIN_RUNS
    tables = []
    for served in (True, False):
        if served:
            helper.start_early(DRAW_SERVER, 2)
        with open_store(plan, tmp_path / str(served)) as store:
            run_into_store(plan, store)
        assert helper.DRAW_SERVER not in helper._EARLY  # taken (and closed) by the sweep
        tables.append(RunStore.read_only(tmp_path / str(served)).read())
    assert len(taken) == 1 and taken[0].served == len(list(plan.batches(DEFAULT_MAX_BATCH[True])))
    assert identical(*tables)

"""``--backend drawer``: the inputs drawn in a second process give the local backend's records
bit for bit; a draw that fails is raised in the command; a consumer that stops early leaves no
drawer out of step behind."""

from __future__ import annotations

import operator

import pytest

from kdalab.records import RunStore, identical
from kdalab.runner import drawer, open_store, run_into_store
from kdalab.studies.sweep import SweepConfig, SweepPlan


def _plan() -> SweepPlan:
    return SweepPlan.of(SweepConfig.parse({
        "families": "floor,model_like", "chunks": "4,8", "seeds": "0-5", "dims": "16",
        "accumulations": "fp64,fp16-seq"}))


def test_drawn_in_a_second_process_the_records_are_the_local_ones(tmp_path):
    plan = _plan()
    for backend in ("local", "drawer"):
        with open_store(plan, tmp_path / backend) as store:
            # batches of 5 runs: more batches than the drawer's depth, cut inside a cell
            assert run_into_store(plan, store, backend=backend, max_batch=5) == len(plan)
    assert identical(RunStore.read_only(tmp_path / "drawer").read(),
                     RunStore.read_only(tmp_path / "local").read())
    assert drawer.start().alive  # kept for the next sweep of this process


def test_a_failing_call_is_raised_and_an_early_stop_closes_the_drawer():
    d = drawer.start()
    calls = [(i, operator.truediv, (1, i)) for i in (1, 2, 0, 4)]
    got = []
    with pytest.raises(ZeroDivisionError):
        for item, result in d.ahead(calls):
            got.append((item, result))
    assert got == [(1, 1.0), (2, 0.5)]
    assert not d.alive  # the 4th call's result was on its way: out of step, so closed
    fresh = drawer.start()
    assert fresh is not d
    assert list(fresh.ahead([("a", operator.add, (2, 3))])) == [("a", 5)]


def test_sweep_backend_drawer_stores_the_local_records(tmp_path, capsys):
    from kdalab.cli import main

    for backend in ("local", "drawer"):
        with pytest.raises(SystemExit) as done:
            main(["sweep", "--families", "floor,model_like", "--chunks", "4,16", "--seeds",
                  "0-2", "--dims", "16", "--out", str(tmp_path / backend), "--quiet",
                  "--backend", backend])
        assert done.value.code == 0, capsys.readouterr().err
    assert identical(RunStore.read_only(tmp_path / "drawer").read(),
                     RunStore.read_only(tmp_path / "local").read())

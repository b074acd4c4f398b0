"""The batched input draws equal the seed document's per-run ``make_inputs``, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kdalab.experiments.draw import make_inputs, make_inputs_batch
from kdalab.experiments.families import FAMILIES
from kdalab.experiments.runs import Run

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from seed_baseline import seed_make_inputs  # noqa: E402  (the seed document's code)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("chunk", [1, 5, 16, 17, 48])
@pytest.mark.parametrize("draw", [dict(workers=1), dict(workers=3), dict(processes=2)],
                         ids=["1_thread", "3_threads", "2_processes"])
def test_batch_equals_the_seed_per_run_draws(chunk, draw):
    # (the chunk sizes in this order also grow the draw processes' shared block)
    dim = 128 if chunk != 5 else 7
    runs = [Run.checked(f, chunk, s, dim, lb)
            for f in FAMILIES for s in range(6) for lb in (-5.0, -0.7)]
    runs = list(dict.fromkeys(runs))  # families without a lower bound run once
    batch = make_inputs_batch(runs, **draw)
    assert batch.keys.shape == (len(runs), chunk, dim)
    for i, r in enumerate(runs):
        lb = -5.0 if r.lower_bound is None else r.lower_bound
        want = seed_make_inputs(r.family, chunk, dim, r.seed, lb)
        one = make_inputs(r.family, chunk, dim, r.seed, lb)
        got = (batch.keys[i], batch.log_decay[i], batch.beta[i])
        for w, g, o in zip(want, got, (one.keys, one.log_decay, one.beta)):
            assert _same(g, w), (r, i)
            assert _same(o, w), r


def test_draw_processes_started_ahead_draw_the_same_bits():
    """Draw processes started in the background before the first draw (as a sweep does while
    it initializes CUDA) are the ones that draw, forked from the fork server on Linux, and the
    inputs equal the threads' bit for bit."""
    from kdalab.experiments import draw

    draw.start_draw_processes(3)
    draw.start_draw_processes(3)  # a second call while they start adds none
    runs = [Run.checked(f, 9, s, 16, -5.0 if FAMILIES[f].uses_lower_bound else None)
            for f in FAMILIES for s in range(5)]
    got = make_inputs_batch(runs, processes=3)
    want = make_inputs_batch(runs, workers=1)
    for g, w in zip((got.keys, got.log_decay, got.beta), (want.keys, want.log_decay, want.beta)):
        assert _same(g, w)
    pool = draw._PROCESS_POOLS[3]
    assert len(pool._processes) == 3
    if sys.platform == "linux":
        assert pool._mp_context.get_start_method() == "forkserver"


def test_batch_checks_its_runs():
    with pytest.raises(ValueError, match="one chunk size"):
        make_inputs_batch([Run.checked("floor", 4, 0, 8, -5.0),
                           Run.checked("floor", 5, 0, 8, -5.0)])
    with pytest.raises(ValueError, match="at least one"):
        make_inputs_batch([])
    with pytest.raises(ValueError, match="lower_bound"):
        make_inputs("floor", 4, 8, 0, 1.0)
    with pytest.raises(ValueError, match="processes"):
        make_inputs_batch([Run.checked("floor", 4, 0, 8, -5.0)], processes=-1)


def test_batched_sigmoid_equals_per_run_on_large_batches():
    # Above torch's parallel grain (32768 values) its CPU sigmoid splits a call across threads
    # at arbitrary points, and each split's tail takes the scalar loop: the batched sigmoid must
    # still equal torch.sigmoid on each run's own tensor (found with n = 2101 at 2 threads).
    from kdalab.experiments.draw import _sigmoid_rows

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(0)
        for n, chunk in ((2101, 17), (3001, 17), (2050, 48)):
            x = torch.randn(n, chunk, dtype=torch.float64, generator=gen)
            assert torch.equal(_sigmoid_rows(x), torch.stack([torch.sigmoid(r.clone())
                                                              for r in x]))
    finally:
        torch.set_num_threads(threads)



def test_sweep_chooses_draw_processes_for_large_cuda_sweeps(monkeypatch):
    from kdalab.experiments import sweep

    monkeypatch.setattr(sweep, "cuda_draw_processes", lambda: 12)
    monkeypatch.setattr(sweep, "draw_processes_running", lambda: False)
    cuda = torch.device("cuda")
    assert sweep.default_draw_processes(10**6, torch.device("cpu")) == 0
    assert sweep.default_draw_processes(sweep.PROCESS_MIN_RUNS - 1, cuda) == 0
    assert sweep.default_draw_processes(sweep.PROCESS_MIN_RUNS, cuda) == 12
    monkeypatch.setattr(sweep, "draw_processes_running", lambda: True)
    assert sweep.default_draw_processes(48, cuda) == 12

"""The batched input draws equal the seed document's per-run ``make_inputs``, bit for bit."""

from __future__ import annotations

import pytest
import torch

from kdalab.inputs.draw import make_inputs, make_inputs_batch
from kdalab.inputs.families import FAMILIES
from kdalab.inputs.runs import Run
from tests.seed_oracle import seed_make_inputs  # the seed document's code

pytestmark = pytest.mark.exact  # the seed's draws, bit for bit


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.fixture
def streams(request, monkeypatch):
    """The key streams' state before a draw: none kept, or kept with a budget so small that
    every batch evicts (``evicting``)."""
    from kdalab.inputs import keystream

    monkeypatch.setattr(keystream.STREAMS, "budget", 1 if request.param == "evicting" else
                        keystream.DEFAULT_BUDGET)
    keystream.STREAMS.clear()
    yield request.param
    keystream.STREAMS.clear()


@pytest.mark.parametrize("streams", ["kept", "evicting"], indirect=True)
@pytest.mark.parametrize("chunk", [1, 5, 16, 17, 48])
def test_batch_equals_the_seed_per_run_draws(chunk, streams):
    dim = 128 if chunk != 5 else 7  # 7: not a multiple of 16, drawn per run
    runs = [Run.checked(f, chunk, s, dim, lb)
            for f in FAMILIES for s in range(6) for lb in (-5.0, -0.7)]
    runs = list(dict.fromkeys(runs))  # families without a lower bound run once
    batch = make_inputs_batch(runs)
    assert batch.keys.shape == (len(runs), chunk, dim)
    for i, r in enumerate(runs):
        lb = -5.0 if r.lower_bound is None else r.lower_bound
        want = seed_make_inputs(r.family, chunk, dim, r.seed, lb)
        one = make_inputs(r.family, chunk, dim, r.seed, lb)
        got = (batch.keys[i], batch.log_decay[i], batch.beta[i])
        for w, g, o in zip(want, got, (one.keys, one.log_decay, one.beta)):
            assert _same(g, w), (r, i)
            assert _same(o, w), r


@pytest.mark.parametrize("streams", ["kept", "evicting"], indirect=True)
@pytest.mark.parametrize("order", ["growing", "shrinking", "shuffled"])
@pytest.mark.parametrize("dim", [16, 128])
def test_key_streams_serve_every_chunk_size_in_any_order(dim, order, streams):
    """A seed's keys are drawn once and served to every chunk size (keystream.py): batches of
    chunks 1…64 (at dim 128; 1…24 at 16) in growing, shrinking and shuffled order, runs
    shuffled within a batch, all equal the seed's per-run make_inputs bit for bit — whether
    the streams are extended, cut shorter (a skip from the first row) or evicted and drawn
    again."""
    import random

    chunks = list(range(1, 65 if dim == 128 else 25))
    if order == "shrinking":
        chunks.reverse()
    elif order == "shuffled":
        random.Random(dim).shuffle(chunks)
    for chunk in chunks:
        runs = list(dict.fromkeys(Run.checked(f, chunk, s, dim, lb) for f in FAMILIES
                                  for s in (0, 11) for lb in (-5.0, -0.7)))
        random.Random(chunk).shuffle(runs)
        batch = make_inputs_batch(runs)
        for i, r in enumerate(runs):
            lb = -5.0 if r.lower_bound is None else r.lower_bound
            want = seed_make_inputs(r.family, chunk, dim, r.seed, lb)
            for w, g in zip(want, (batch.keys[i], batch.log_decay[i], batch.beta[i])):
                assert _same(g, w), (r, order)


def test_batch_checks_its_runs():
    with pytest.raises(ValueError, match="one chunk size"):
        make_inputs_batch([Run.checked("floor", 4, 0, 8, -5.0),
                           Run.checked("floor", 5, 0, 8, -5.0)])
    with pytest.raises(ValueError, match="at least one"):
        make_inputs_batch([])
    with pytest.raises(ValueError, match="lower_bound"):
        make_inputs("floor", 4, 8, 0, 1.0)


def test_batched_sigmoid_equals_per_run_on_large_batches():
    # Above torch's parallel grain (32768 values) its CPU sigmoid splits a call across threads
    # at arbitrary points, and each split's tail takes the scalar loop: the batched sigmoid must
    # still equal torch.sigmoid on each run's own tensor (found with n = 2101 at 2 threads).
    from kdalab.inputs.draw import _sigmoid_rows

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

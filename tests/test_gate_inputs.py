"""The strong-decay families and the gate modes of kdalab.inputs.sequences: they draw the same
bits every time, keep the decay ranges they promise, and a log-decay draw is the fp64 gate of the
raw draw (issue 41)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kdalab.inputs.sequences import (
    MIXED_DECAY,
    MODEL_LIKE,
    STRONG_DECAY,
    STRONGEST_DECAY,
    draw,
    kda_kwargs,
)
from kdalab.kda import log_decay, reference_forward

SHAPE = dict(T=64, heads=2, K=32, V=32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _decay(x: dict) -> torch.Tensor:
    """The per-step log-decay a draw hands a kernel, in fp64 (the reference's gate)."""
    if x["gate"] == "log_decay":
        return x["g"].double()
    return log_decay(x["g"], gate=x["gate"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                     lower_bound=x["lower_bound"])


@pytest.mark.parametrize("spec", [STRONG_DECAY, STRONGEST_DECAY, MIXED_DECAY])
@pytest.mark.parametrize("as_log_decay", [None, "fp32", "bf16"])
def test_strong_families_draw_the_same_bits_every_time(spec, as_log_decay):
    spec = replace(spec, **SHAPE, g_as_log_decay=as_log_decay)
    a, b, other = draw(spec, 7), draw(spec, 7), draw(spec, 8)
    for name in ("q", "k", "v", "g", "beta"):
        assert torch.equal(_bits(a[name]), _bits(b[name])), name
    assert not torch.equal(a["g"], other["g"]) or spec.log_decay is not None
    assert a["gate"] == ("unbounded" if as_log_decay is None else "log_decay")
    assert a["lower_bound"] is None
    if as_log_decay is not None:
        assert a["A_log"] is None and a["dt_bias"] is None  # nothing to apply to a log-decay
        assert a["g"].dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[as_log_decay]


def test_strong_decay_lies_in_its_range():
    raw = _decay(draw(replace(STRONG_DECAY, **SHAPE), 0))
    # the raw gate input is solved in float64 for the drawn decay, then rounded to bf16 (2^-9
    # relative): the decay moves by at most 2^-9·(|decay| + exp(A_log)·|dt_bias|) < 0.08 here
    assert float(raw.min()) >= -20.08 and float(raw.max()) <= -5 + 0.08
    assert float(raw.min()) < -19.5 and float(raw.max()) > -5.5  # the range is spanned
    given = draw(replace(STRONG_DECAY, **SHAPE, g_as_log_decay="fp32"), 0)["g"]
    assert float(given.min()) >= -20.0 and float(given.max()) <= -5.0  # exactly the draw
    # every 16-token chunk of every channel spans more than float32's exp range (88.7): a split
    # exponent exp(G_i)·exp(-G_j) overflows without a safe path
    span = -given.double().reshape(1, 4, 16, 2, 32).sum(2)
    assert float(span.min()) > 88.8


def test_strongest_decay_is_minus_20():
    given = draw(replace(STRONGEST_DECAY, **SHAPE, g_as_log_decay="fp32"), 0)["g"]
    assert bool((given == -20.0).all())
    assert bool((draw(replace(STRONGEST_DECAY, **SHAPE, g_as_log_decay="bf16"), 0)["g"]
                 == -20.0).all())  # -20 is a bf16 value
    raw = _decay(draw(replace(STRONGEST_DECAY, **SHAPE), 0))
    assert float((raw + 20).abs().max()) < 0.08  # g rounded to bf16, as above


def test_mixed_decay_has_strong_and_weak_channels():
    raw = draw(replace(MIXED_DECAY, **SHAPE), 3)
    given = draw(replace(MIXED_DECAY, **SHAPE, g_as_log_decay="fp32"), 3)
    g = given["g"]
    strong = (g <= -8.0).all(1).all(0)  # [H, K]: channels strong at every step
    assert strong.sum(-1).tolist() == [8, 8]  # a quarter of K = 32 in each head
    assert float(g[..., strong].min()) >= -20.0 and float(g[..., strong].max()) <= -8.0
    weak = g[..., ~strong]
    # weak channels: -exp(A_log)·softplus(N(-6, 1) + dt_bias), A_log, dt_bias in [0, 1]: about
    # -0.01 per step; a 4-sigma raw gate (of 3,072 draws) gives -0.85 at most
    assert float(weak.max()) <= 0 and float(weak.min()) > -2.0
    assert float(weak.median()) > -0.05
    # the log-decay draw is the fp64 gate of the raw draw where no fixed decay was set, rounded
    # to float32; the strong channels are the same in both modes
    fp64 = _decay(raw)
    assert torch.equal(g[..., ~strong], fp64.float()[..., ~strong])
    assert bool((fp64[..., strong] <= -7.9).all()) and bool((fp64[..., ~strong] > -2).all())


def test_a_bounded_log_decay_keeps_its_bound_as_the_promise():
    raw = draw(replace(MODEL_LIKE, **SHAPE), 4)
    given = draw(replace(MODEL_LIKE, **SHAPE, g_as_log_decay="fp32"), 4)
    assert given["gate"] == "log_decay" and given["lower_bound"] == -5.0
    assert torch.equal(given["g"], _decay(raw).float())
    assert float(given["g"].min()) >= -5.0 and float(given["g"].max()) <= 0.0
    for name in ("q", "k", "v", "beta"):  # only g changes with the mode
        assert torch.equal(given[name], raw[name])
    # the references agree up to the float32 rounding of each step's decay (relative 2^-24 per
    # step, summed over 64 steps and scaled by the state's size: far below 1e-5)
    o_raw, _ = reference_forward(**_ref_args(raw))
    o_given, _ = reference_forward(**_ref_args(given))
    assert float((o_raw - o_given).norm() / o_raw.norm()) < 1e-5


def _ref_args(x: dict) -> dict:
    kw = kda_kwargs(x)
    return {n: kw[n] for n in ("q", "k", "v", "g", "beta", "scale", "A_log", "dt_bias",
                               "lower_bound", "gate", "beta_is_logits", "use_qk_l2norm",
                               "initial_state", "cu_seqlens")}

"""The sequence-level generator (kdalab.inputs.sequences): the presets draw what the end-to-end
study and check drew before they drew through it, bit for bit (stored digests); check's cases are
presets plus poisoning; the knobs do what they say; bad values name their field."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kdalab.check.cases import FULL, QUICK, case_inputs, case_spec
from kdalab.inputs.sequences import (
    COLLINEAR,
    MODEL_LIKE,
    PRESETS,
    SequenceSpec,
    draw,
    kda_kwargs,
    preset,
)

pytestmark = pytest.mark.exact  # the draws against stored digests, bit for bit

_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INTS[t.element_size()]) if t.is_floating_point() else t


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(_bits(a), _bits(b)))
    return a == b


#: tests/data/inputs_before.json: sha256 digests of the tensors that the end-to-end study's and
#: check's own draws (``study_inputs``, ``case_inputs`` of commit ce5268f) made on the CPU,
#: before both drew through kdalab.inputs.sequences: data from before the change.
BEFORE = json.loads((Path(__file__).parent / "data" / "inputs_before.json").read_text())
#: ATen's vectorized CPU kernels: torch's float32 randn gives the same bits under both (the
#: digests were checked under each); the generic ``default`` kernels round it otherwise.
VECTOR_CPU = ("AVX2", "AVX512")


def _digest(x):
    if not isinstance(x, torch.Tensor):
        return x
    x = x.contiguous()
    raw = (x if x.dtype == torch.bool else x.view(torch.uint8)).numpy().tobytes()
    return f"{x.dtype}:{list(x.shape)}:" + hashlib.sha256(raw).hexdigest()[:32]


def _reproducible_randn():
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in VECTOR_CPU:
        pytest.skip(f"ATen CPU capability {cap}: float32 randn rounds otherwise than under "
                    f"{'/'.join(VECTOR_CPU)}, where the stored digests were made")


def test_presets_draw_what_the_study_drew_before_bit_for_bit():
    """The study's families as presets give the very tensors the study's former draws gave
    (stored digests; 4 families × 3 gates × 3 shapes, up to T = 1024, K = 128)."""
    _reproducible_randn()
    assert len(BEFORE["study_inputs"]) == 36
    for row in BEFORE["study_inputs"]:
        spec = preset(row["family"], T=row["T"], heads=row["heads"], K=row["dim"],
                      V=row["dim"], lower_bound=row["lower_bound"])
        got = kda_kwargs(draw(spec, row["seed"]))
        assert got["initial_state"] is None and got["cu_seqlens"] is None
        assert {n: _digest(got[n]) for n in row["tensors"]} == row["tensors"], row


def test_check_draws_what_it_drew_before_bit_for_bit():
    """check's cases (the quick suite and eleven of the full one) draw through the presets the
    very tensors check's former draws gave, poisoning and masks included, except one change
    made on purpose: a collinear case with key noise > 0 takes its noise from the generator's
    key draw (the second N(0, 1) block) where check drew it after the shared key, so its ``k``
    differs (with noise 0 the keys are the same)."""
    _reproducible_randn()
    suites = {"quick": {c.name: c for c in QUICK}, "full": {c.name: c for c in FULL}}
    assert len(BEFORE["case_inputs"]) == 38
    for row in BEFORE["case_inputs"]:
        case = suites[row["suite"]][row["case"]]
        x = case_inputs(case)
        got = {n: _digest(getattr(x, n)) for n in row["tensors"]}
        want = dict(row["tensors"])
        if case.family == "collinear" and case.key_noise > 0:
            assert got.pop("k") != want.pop("k")
        assert got == want, row["case"]


@pytest.mark.parametrize("name", ["nonfinite/nan_v", "nonfinite/inf_k", "collinear/eps0.05",
                                  "varlen/empty", "h0/bf16", "prenorm"])
def test_check_cases_are_the_presets_with_one_value_poisoned(name):
    case = next(c for c in QUICK if c.name == name)
    x, plain = case_inputs(case), draw(case_spec(case), case.seed)
    poisoned = {"nan_v": "v", "inf_k": "k"}.get(case.poison)
    for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
        a, b = getattr(x, n), plain[n]
        if a is None:
            assert b is None
            continue
        differ = ~((a == b) | (a.isnan() & b.isnan())) if a.is_floating_point() else a != b
        assert int(differ.sum()) == (1 if n == poisoned else 0), (name, n)
    assert int((~x.rows).sum()) == (case.T if case.poison else 0)


def test_draw_gives_chunk_kda_fwd_arguments_the_same_every_time():
    spec = replace(MODEL_LIKE, T=20, heads=2, K=8, V=16, initial_state="bf16", state_scale=4.0)
    a, b = draw(spec, 3), draw(spec, 3)
    assert set(a) == {"q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state",
                      "cu_seqlens", "lower_bound", "scale", "use_qk_l2norm", "gate"}
    assert a["gate"] == "lower_bound"
    assert all(_same(a[n], b[n]) for n in a)
    assert not _same(a["q"], draw(spec, 4)["q"])
    assert [a[n].dtype for n in ("q", "k", "v", "g", "beta")] == [torch.bfloat16] * 5
    assert a["A_log"].dtype == a["dt_bias"].dtype == torch.float32
    assert a["v"].shape == (1, 20, 2, 16) and a["dt_bias"].shape == (2, 8)
    assert a["initial_state"].dtype == torch.bfloat16 and a["initial_state"].shape == (1, 2, 8, 16)
    assert a["scale"] == 8 ** -0.5


def _cos(k: torch.Tensor) -> torch.Tensor:
    """Cosines between consecutive keys ``[B, T-1, H]``."""
    k = k.double()
    k = k / k.norm(dim=-1, keepdim=True)
    return (k[:, 1:] * k[:, :-1]).sum(-1)


def test_key_clusters_and_eps():
    one = draw(replace(COLLINEAR, T=32, heads=2, K=64, V=64, key_eps=0.0), 0)["k"]
    assert torch.equal(one, one[:, :1].expand_as(one))  # eps 0: one key, exactly
    near = draw(replace(COLLINEAR, T=32, heads=2, K=64, V=64), 0)["k"]
    # eps 0.05 in 64 dims: cosine ~ 1/(1 + 0.05²) = 0.9975 (bf16 rounding moves it by ~1e-3)
    assert float(_cos(near).min()) > 0.99
    free = draw(replace(MODEL_LIKE, T=32, heads=2, K=64, V=64), 0)["k"]
    assert float(_cos(free).abs().max()) < 0.6  # independent 64-dim keys: |cos| ~ 1/8
    three = draw(replace(COLLINEAR, T=64, heads=1, K=64, V=64, key_eps=0.0, key_clusters=3), 0)
    assert len(torch.unique(three["k"][0, :, 0], dim=0)) == 3


def test_hard_block_sits_where_said_in_every_sequence():
    spec = replace(COLLINEAR, seqlens=(20, 30), heads=1, K=16, V=16, key_eps=0.0, block=(4, 8))
    x = draw(spec, 1)
    assert x["cu_seqlens"].tolist() == [0, 20, 50] and x["k"].shape[1] == 50
    k, beta, g = x["k"][0, :, 0], x["beta"][0, :, 0], x["g"][0, :, 0, 0]
    for start in (0, 20):
        inside = range(start + 4, start + 12)
        assert all(torch.equal(k[i], k[start + 4]) for i in inside)
        assert all(float(beta[i]) == 10.0 and float(g[i]) == -10.0 for i in inside)
        for i in (start + 3, start + 12):  # ordinary tokens around the block
            assert not torch.equal(k[i], k[start + 4]) and float(beta[i]) != 10.0


@pytest.mark.parametrize("lower_bound", [-5.0, None])
def test_log_decay_is_met_with_any_a_log_and_dt_bias(lower_bound):
    spec = replace(MODEL_LIKE, T=4, heads=3, K=8, V=8, log_decay=-0.02, lower_bound=lower_bound,
                   A_log=(-1.0, 1.0), dt_bias=(-0.5, 0.5))
    x = draw(spec, 2)
    a, u = x["A_log"].double().exp()[:, None], x["g"][0, 0].double() + x["dt_bias"].double()
    decay = (lower_bound * torch.sigmoid(a * u) if lower_bound is not None
             else -a * torch.nn.functional.softplus(u))
    # g is rounded to bf16 (8 bits): |Δg| <= 2^-9·|g| moves the decay by a few percent at most
    assert torch.allclose(decay, torch.full_like(decay, -0.02), rtol=0.05)


def test_v_and_state_scales():
    base = replace(MODEL_LIKE, T=8, heads=1, K=8, V=8, initial_state="fp32")
    a = draw(base, 5)
    b = draw(replace(base, v_scale=2.0 ** 17, state_scale=2.0 ** -3), 5)
    assert torch.equal(b["v"].float(), a["v"].float() * 2.0 ** 17)  # powers of two: exact
    assert torch.equal(b["initial_state"], a["initial_state"] * 2.0 ** -3)


def test_spec_round_trips_through_its_dict():
    spec = replace(COLLINEAR, seqlens=(3, 5), block=(1, 2), initial_state="bf16")
    assert SequenceSpec.from_dict(spec.as_dict()) == spec
    assert spec.T == 8 and spec.sequences == 2
    assert set(PRESETS) == {"model_like", "saturated", "weak_decay_correlated", "long",
                            "collinear", "strong_decay", "strongest_decay", "mixed_decay"}
    strong = replace(PRESETS["mixed_decay"], g_as_log_decay="bf16")
    assert SequenceSpec.from_dict(strong.as_dict()) == strong


@pytest.mark.parametrize("change, field", [
    (dict(T=0), "T"), (dict(heads=1.5), "heads"), (dict(key_clusters=-1), "key_clusters"),
    (dict(key_eps=-0.1), "key_eps"), (dict(beta_mean=math.inf), "beta_mean"),
    (dict(g_spread=math.nan), "g_spread"), (dict(v_scale=0.0), "v_scale"),
    (dict(lower_bound=0.5), "lower_bound"), (dict(log_decay=-6.0), "log_decay"),
    (dict(A_log=(1.0, 0.0)), "A_log"), (dict(dt_bias=(0.0,)), "dt_bias"),
    (dict(initial_state="fp16"), "initial_state"), (dict(block=(2000, 1)), "block"),
    (dict(block=(0, 0)), "block"), (dict(seqlens=(0, 0)), "seqlens"),
    (dict(seqlens=(3, -1)), "seqlens"),
    (dict(seqlens=(3,), batch=2), "batch"),
    (dict(decay_range=(-20.0, -5.0)), "decay_range"),  # below the bound -5
    (dict(lower_bound=None, decay_range=(-5.0, -20.0)), "decay_range"),
    (dict(lower_bound=None, decay_range=(-5.0, 0.0)), "decay_range"),
    (dict(lower_bound=None, log_decay=-1.0, decay_range=(-2.0, -1.0)), "decay_range"),
    (dict(decay_channels=0.5), "decay_channels"), (dict(log_decay=-1.0, decay_channels=0.0),
                                                   "decay_channels"),
    (dict(g_as_log_decay="fp16"), "g_as_log_decay"),
])
def test_bad_values_name_their_field(change, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        replace(MODEL_LIKE, **change)


def test_bad_preset_and_seed():
    with pytest.raises(ValueError, match="preset must be one of"):
        preset("weak_decay")
    with pytest.raises(ValueError, match="^seed must be"):
        draw(MODEL_LIKE, -1)
    with pytest.raises(ValueError, match="unknown field"):
        SequenceSpec.from_dict({"eps": 0.1})

"""The chunked forward: fp64 equals the recurrent reference for every tile strategy and inverse;
recipe errors. (The flashkda recipes against FlashKDA itself: test_flashkda_golden.py.)"""

import itertools
from dataclasses import dataclass, field

import pytest
import torch

from kdalab.arith import rel_rmse
from kdalab.kda import TILES, forward, recurrent_kda, reference_forward

pytestmark = pytest.mark.exact  # batching, threads, packing and layouts change no bit


def err(a, b):
    return rel_rmse(a.flatten(), b.flatten(), 1).item()


def bf16_layer(gen, t, h, d):
    """A layer's bf16 inputs as the model sees them, drawn in this order from ``gen``: q, k,
    v, g [1, t, h, d] and β [1, t, h] ~ N(0, 1), A_log [h] and dt_bias [h, d] ~ U(0, 1)."""
    q, k, v, g = (torch.randn(1, t, h, d, generator=gen).bfloat16() for _ in range(4))
    beta = torch.randn(1, t, h, generator=gen).bfloat16()
    return q, k, v, g, beta, torch.rand(h, generator=gen), torch.rand(h, d, generator=gen)


def make(b=2, t=37, h=1, hv=2, kd=16, vd=8, seed=0, lb=-5.0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k = r(b, t, h, kd), torch.nn.functional.normalize(r(b, t, h, kd), dim=-1)
    v = r(b, t, hv, vd)
    g = lb * torch.rand(b, t, hv, kd, generator=gen, dtype=torch.float64)
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta, r(b, hv, kd, vd)


PLAIN = dict(gate="log_decay", lower_bound=None, beta_is_logits=False, use_qk_l2norm=False,
             recipe="fp64")

# fp64 agreement: every product/sum is float64 and exp(±G) stays below e^(5·24) = 1e52, so the
# chunked and recurrent orders differ by a few hundred ulps at most; 1e-12 is the claim.
TOL = 1e-12


@pytest.mark.parametrize("chunk", [1, 5, 16, 24])
def test_fp64_equals_recurrent_every_strategy_and_inverse(chunk):
    q, k, v, g, beta, h0 = make()
    o_ref, s_ref = recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    for tiles, inverse in itertools.product(TILES, ["neumann", "forward_substitution", "exact"]):
        o, s = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                       chunk_size=chunk, tiles=tiles, inverse=inverse, **PLAIN)
        assert o.dtype == s.dtype == torch.float64
        assert err(o, o_ref) <= TOL and err(s, s_ref) <= TOL, (chunk, tiles, inverse)


@pytest.mark.parametrize("tiles", ["chunk_start", "secondary", "per_pair"])
def test_fp64_varlen_states_grouped_heads(tiles):
    q, k, v, g, beta, _ = make(b=1, t=45, h=2, hv=4)
    cu = torch.tensor([0, 3, 20, 45])  # ragged tails everywhere for chunk 8
    h0 = torch.randn(3, 4, 16, 8, dtype=torch.float64)
    for state in (None, h0):
        o_ref, s_ref = recurrent_kda(q, k, v, g, beta, initial_state=state,
                                     output_final_state=True, cu_seqlens=cu)
        o, s = forward(q, k, v, g, beta, initial_state=state, output_final_state=True,
                       cu_seqlens=cu, chunk_size=8, tiles=tiles, inverse="neumann", **PLAIN)
        assert err(o, o_ref) <= TOL and err(s, s_ref) <= TOL
    o_vk, s_vk = forward(q, k, v, g, beta, initial_state=h0.transpose(-1, -2),
                         output_final_state=True, cu_seqlens=cu, chunk_size=8, tiles=tiles,
                         state_layout="VK", **PLAIN)
    o_kv, s_kv = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                         cu_seqlens=cu, chunk_size=8, tiles=tiles, **PLAIN)
    assert torch.equal(o_vk, o_kv) and torch.equal(s_vk, s_kv.transpose(-1, -2))


def test_fp64_full_layer_matches_reference_forward():
    q, k, v, g, beta, a_log, dt_bias = bf16_layer(torch.Generator().manual_seed(3), 40, 2, 32)
    kw = dict(A_log=a_log, dt_bias=dt_bias, lower_bound=-8.0, output_final_state=True)
    o_ref, s_ref = reference_forward(q, k, v, g, beta, **kw)
    o, s = forward(q, k, v, g, beta, chunk_size=16, tiles="midpoint", recipe="fp64", **kw)
    assert err(o, o_ref) <= TOL and err(s, s_ref) <= TOL


def test_recipe_errors_against_fp64_model_like():
    """flashkda at C = 16 lands where FlashKDA's published reference does against fp64 (5–6.5e-3
    measured on random inputs); fp32 is ~1e-6; fla is between."""
    q, k, v, g, beta, a_log, dt_bias = bf16_layer(torch.Generator().manual_seed(0), 256, 1, 128)
    kw = dict(A_log=a_log, dt_bias=dt_bias, lower_bound=-5.0, output_final_state=True)
    o_ref, _ = reference_forward(q, k, v, g, beta, **kw)
    o, _ = forward(q, k, v, g, beta, recipe="flashkda", chunk_size=16, **kw)
    assert 3e-3 < err(o, o_ref) < 8e-3
    o, _ = forward(q, k, v, g, beta, recipe="fp32", chunk_size=16, **kw)
    assert err(o, o_ref) < 1e-5
    o, _ = forward(q, k, v, g, beta, recipe="fla", chunk_size=64, tiles="secondary-midpoint",
                   inverse="forward_substitution", **kw)
    assert err(o, o_ref) < 8e-3
    o, _ = forward(q, k, v, g, beta, recipe="flashkda", chunk_size=64, **kw)
    assert not bool(torch.isfinite(o).all())  # exp(−G) over a 64-token chunk overflows bf16


@pytest.mark.parametrize("recipe", ["flashkda", "fla", "flashkda-h200"])
def test_deterministic_across_batch_size_and_threads(recipe):
    """The same sequence gives the same bits alone or in a batch of 5, on 1 thread or 2 (torch's
    intra-op threads split batched products and elementwise ops differently)."""
    gen = torch.Generator().manual_seed(7)
    b, t, h, d = 5, 40, 1, 32
    q, k, v, g = (torch.randn(b, t, h, d, generator=gen).bfloat16() for _ in range(4))
    beta = torch.randn(b, t, h, generator=gen).bfloat16()
    kw = dict(A_log=torch.rand(h, generator=gen), dt_bias=torch.rand(h, d, generator=gen),
              lower_bound=-5.0, output_final_state=True, recipe=recipe, chunk_size=16)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            o, s = forward(q, k, v, g, beta, **kw)
            alone = [forward(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1],
                             **kw) for i in (0, 3)]
            results.append((o, s))
            for i, (oi, si) in zip((0, 3), alone):
                assert torch.equal(o[i:i + 1], oi) and torch.equal(s[i:i + 1], si), (n, i)
        (o1, s1), (o2, s2) = results
        assert torch.equal(o1, o2) and torch.equal(s1, s2)
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Recording:
    """An accumulation model that computes as ``inner`` and notes every product's (M, K, N)."""

    inner: object
    calls: list = field(default_factory=list, compare=False, hash=False)

    def __getattr__(self, name):  # name, out_dtype, needs_cuda, gpu_twin, fp32_companion
        return getattr(self.inner, name)

    def matmul(self, a, b):
        self.calls.append((a.shape[-2], a.shape[-1], b.shape[-1]))
        return self.inner.matmul(a, b)


def test_tensor_core_models_drop_into_the_recipe():
    """flashkda-h200 is flashkda with other accumulation models, nothing else: the recipe's three
    model fields carry every product of the forward (recorded: L and Mqk by ``l_accumulation``
    at K = head dim, the Neumann products by ``inverse_accumulation`` at C×C×C, the five
    recurrence products per chunk by ``matmul_accumulation``), wrappers that only record give
    the same bits, and on the stress input (large L, long Neumann chains) the Tensor Cores'
    arithmetic changes the result while both stay near the fp64 reference. (Which of the two is
    closer depends on the input: on 64 tokens the Tensor Cores were closer for both seeds, on
    48 not for seed 1; the seed's own finding is about the inverse alone, see test_tensorcore.)"""
    from kdalab.kda import get_recipe
    from kdalab.studies.end_to_end import study_inputs

    base, h200 = get_recipe("flashkda"), get_recipe("flashkda-h200")
    assert h200 == base.with_(name="flashkda-h200", l_accumulation="h200-bf16-fp32",
                              inverse_accumulation="h200-mma",
                              matmul_accumulation="h200-bf16-fp32")
    t, c, d = 48, 16, 32
    kw = study_inputs("weak_decay_correlated", -5.0, 0, t, 1, d)
    rec = {f: Recording(getattr(h200, f)) for f in
           ("l_accumulation", "inverse_accumulation", "matmul_accumulation")}
    recorded = h200.with_(name="recorded", **rec)
    o, s = forward(**kw, recipe="flashkda-h200", chunk_size=c, output_final_state=True)
    o_rec, s_rec = forward(**kw, recipe=recorded, chunk_size=c, output_final_state=True)
    assert torch.equal(o, o_rec) and torch.equal(s, s_rec)
    chunks = t // c
    assert sorted(rec["l_accumulation"].calls) == [(c, d, c)] * 2  # L and Mqk, all chunks at once
    assert rec["inverse_accumulation"].calls == [(c, c, c)] * 6  # (I−L)(I+L²)(I+L⁴)(I+L⁸)
    assert sorted(rec["matmul_accumulation"].calls) == sorted(
        [(c, d, d), (c, c, d), (c, d, d), (c, c, d), (d, c, d)] * chunks)
    o_ref, s_ref = reference_forward(**kw, output_final_state=True)
    # the same recipe with the seed's CPU arithmetic in the three model fields
    seed_models = base.with_(name="seed-models", l_accumulation="fp32",
                             inverse_accumulation="fp16-seq", matmul_accumulation="fp32")
    o_seq, s_seq = forward(**kw, recipe=seed_models, chunk_size=c, output_final_state=True)
    assert not torch.equal(o_seq, o) and not torch.equal(s_seq, s)
    # both within the bf16 pipeline's error on this input (measured 1.4e-2 to 2.8e-2)
    for mine, ref in ((o, o_ref), (s, s_ref), (o_seq, o_ref), (s_seq, s_ref)):
        assert err(mine, ref) < 5e-2


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None)
@given(t=st.integers(1, 30), chunk=st.integers(1, 20), group=st.sampled_from([1, 2]),
       tiles=st.sampled_from(sorted(TILES)),
       inverse=st.sampled_from(["neumann", "forward_substitution", "exact"]),
       lb=st.sampled_from([-0.5, -3.0, -6.0]), seed=st.integers(0, 2**16))
def test_fp64_equals_recurrent_property(t, chunk, group, tiles, inverse, lb, seed):
    q, k, v, g, beta, h0 = make(b=1, t=t, h=1, hv=group, kd=8, vd=4, seed=seed, lb=lb)
    o_ref, s_ref = recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = forward(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                   chunk_size=chunk, tiles=tiles, inverse=inverse, **PLAIN)
    assert err(o, o_ref) <= TOL and err(s, s_ref) <= TOL


@pytest.mark.parametrize("recipe", ["flashkda", "fla"])
def test_low_precision_varlen_equals_separate_sequences(recipe):
    """Packing sequences (padding with inert tokens, a batch of sequences) changes no bit."""
    gen = torch.Generator().manual_seed(0)
    t, h, d = 45, 1, 32
    q, k, v, g, beta, a_log, dt_bias = bf16_layer(gen, t, h, d)
    kw = dict(A_log=a_log, dt_bias=dt_bias, lower_bound=-5.0, output_final_state=True,
              recipe=recipe)
    cu = torch.tensor([0, 5, 22, 45])
    h0 = torch.randn(3, h, d, d, generator=gen).bfloat16()
    o, s = forward(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, **kw)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        oi, si = forward(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
                         initial_state=h0[i:i + 1], **kw)
        assert torch.equal(o[:, a:b], oi) and torch.equal(s[i:i + 1], si)

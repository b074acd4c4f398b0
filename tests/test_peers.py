"""``kdalab.peers``: the one home of fla and FlashKDA calls, checked without a GPU through
stand-ins with the peers' real signatures."""

from __future__ import annotations

import os
import sys
import types
from dataclasses import replace

import pytest
import torch

from kdalab import peers
from kdalab.check import load_kernel, run_check, select_cases
from kdalab.check.cases import QUICK, Case


def _inputs(h=2, kd=128, t=5, n=1):
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(n, t, h, kd, generator=gen).bfloat16() for _ in range(4))
    return dict(q=q, k=k, v=v, g=g, beta=torch.randn(n, t, h, generator=gen).bfloat16()), dict(
        scale=kd ** -0.5, initial_state=torch.randn(n, h, kd, kd, generator=gen),
        output_final_state=True, A_log=torch.rand(h, generator=gen),
        dt_bias=torch.rand(h, kd, generator=gen), lower_bound=-5.0, cu_seqlens=None)


def test_available_names_the_peers():
    with pytest.raises(ValueError, match="peer must be one of"):
        peers.available("triton")
    reason = peers.available("flashkda")
    assert reason is None or "flash_kda cannot be imported" in reason


def test_flashkda_fwd_follows_its_signature(monkeypatch):
    seen = {}

    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None):
        seen.update(dt_bias=tuple(dt_bias.shape), final=final_state)
        out.fill_(1)
        final_state.fill_(2)

    monkeypatch.setitem(sys.modules, "flash_kda", types.SimpleNamespace(fwd=fwd))
    x, kw = _inputs()
    kw["dt_bias"] = kw["dt_bias"].reshape(-1)  # flat in, [H, K] to FlashKDA
    o, s = peers.flashkda_fwd(**x, **kw)
    assert seen["dt_bias"] == (2, 128) and s is seen["final"]
    assert s.dtype == torch.float32 and s.shape == (1, 2, 128, 128) and bool((o == 1).all())


def test_fla_chunk_kda_keeps_flas_own_path(monkeypatch):
    seen = {}

    def chunk_kda(q, k, v, g, beta, **kw):
        seen.update(env=os.environ.get("FLA_FLASH_KDA"), grad=torch.is_grad_enabled(), **kw)
        return v, kw["initial_state"]

    fake = types.ModuleType("fla.ops.kda")
    fake.chunk_kda = chunk_kda
    monkeypatch.setitem(sys.modules, "fla.ops.kda", fake)
    before = os.environ.get("FLA_FLASH_KDA")
    x, kw = _inputs(kd=16)
    with torch.no_grad():  # a caller without gradients must still get fla's own kernels
        peers.fla_chunk_kda(**x, **kw)
    assert seen["env"] == "0" and seen["grad"] is True
    assert seen["dt_bias"].shape == (32,) and seen["safe_gate"] is True
    assert seen["use_gate_in_kernel"] and seen["use_beta_sigmoid_in_kernel"]
    assert "state_v_first" not in seen
    assert os.environ.get("FLA_FLASH_KDA") == before


# -- the peers' adapters without a GPU ----------------------------------------------------------

def test_fla_adapters_call_fla_as_documented(monkeypatch):
    """fla's kernels need CUDA: check the adapters' calls against fla's real signatures, and
    run the check through a stand-in that asserts what the adapter must set."""
    import inspect

    fla_kda = pytest.importorskip("fla.ops.kda")
    seen = {}

    def stand_in(real, recipe, chunked):
        def fn(q, k, v, g, beta, **kw):
            inspect.signature(real).bind(q, k, v, g, beta, **kw)
            seen[real.__name__] = (os.environ.get("FLA_FLASH_KDA"), torch.is_grad_enabled(), kw)
            assert kw["dt_bias"].dim() == 1 and kw["use_gate_in_kernel"]
            assert kw["use_beta_sigmoid_in_kernel"] and kw["lower_bound"] < 0
            h0 = kw["initial_state"]
            if chunked:
                assert kw["safe_gate"] is True
                assert h0 is None or h0.dtype == torch.float32, "initial_state must be in float32."
            from kdalab.kda import forward
            return forward(q, k, v, g, beta, scale=kw["scale"], A_log=kw["A_log"],
                           dt_bias=kw["dt_bias"], lower_bound=kw["lower_bound"],
                           initial_state=h0, output_final_state=True,
                           cu_seqlens=kw["cu_seqlens"],
                           use_qk_l2norm=kw["use_qk_l2norm_in_kernel"], recipe=recipe)
        return fn

    before = os.environ.get("FLA_FLASH_KDA")
    monkeypatch.setattr(fla_kda, "chunk_kda", stand_in(fla_kda.chunk_kda, "fla", True))
    monkeypatch.setattr(fla_kda, "fused_recurrent_kda",
                        stand_in(fla_kda.fused_recurrent_kda, "fp32", False))
    cases = select_cases(QUICK, "model_like,h0/bf16,varlen/mixed,prenorm")
    recs = run_check([load_kernel("fla"), load_kernel("fla-recurrent")], cases)
    status = {(r["kernel"], r["case"]): (r["status"], r["message"]) for r in recs}
    assert status[("fla", "h0/bf16")] == ("unsupported", "declared: initial state in bfloat16: "
                                                         "takes float32")
    assert all(status[(k, c)][0] == "pass" for k in ("fla", "fla-recurrent")
               for c in ("model_like", "varlen/mixed", "prenorm"))
    flash_off, grad_on, _ = seen["chunk_kda"]
    assert flash_off == "0" and grad_on  # fla's own Triton path, not its FlashKDA dispatch
    assert os.environ.get("FLA_FLASH_KDA") == before  # restored after the call


def test_flashkda_adapter_follows_flash_kda_fwd(monkeypatch):
    """A stand-in ``flash_kda`` with FlashKDA's signature and checks (its csrc/flash_kda.cpp):
    [N, H, V, K] states of the initial state's dtype, dt_bias [H, K], int64 cu_seqlens,
    D = 128 only; computed by kdalab's flashkda recipe in FlashKDA's state layout."""
    import types

    from kdalab.kda import forward

    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None):
        if q.shape[-1] != 128 or v.shape != q.shape:
            raise RuntimeError("currently only supports D == 128")
        assert dt_bias.shape == (q.shape[2], q.shape[3]) and dt_bias.dtype == torch.float32
        assert cu_seqlens is None or cu_seqlens.dtype == torch.int64
        if initial_state is not None:
            assert initial_state.dtype == final_state.dtype and initial_state.is_contiguous()
        o, s = forward(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                       lower_bound=lower_bound, initial_state=initial_state,
                       output_final_state=True, cu_seqlens=cu_seqlens, state_layout="VK")
        out.copy_(o)
        final_state.copy_(s)

    monkeypatch.setitem(sys.modules, "flash_kda", types.SimpleNamespace(fwd=fwd))
    kernel = load_kernel("flashkda")
    assert kernel.state_layout == "VK" and kernel.qk_l2norm_flag is None
    small = Case("k128", T=20, heads=1, K=128, V=128)
    cases = [small, replace(small, name="k128/bf16", initial_state="bf16"),
             replace(small, name="k128/varlen", seqlens=(7, 13)), QUICK[0]]
    recs = {r["case"]: r for r in run_check([kernel], cases)}
    for name in ("k128", "k128/bf16", "k128/varlen"):
        assert recs[name]["status"] == "pass", recs[name]
    assert recs["k128/bf16"]["state_dtype"] == "bfloat16"
    assert recs["model_like"]["message"] == "declared: head dims K=32, V=32: takes 128"

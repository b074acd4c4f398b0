"""``kdalab.peers``: the one home of fla and FlashKDA calls, checked without a GPU through
stand-ins with the peers' real signatures."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from kdalab import peers


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

"""The Gluon dS pass (``kernels/chunk_recurrent_bwd_ws.py``, issue 40's candidate).

Gluon has no interpreter, so on the CPU the kernel is compiled for sm_90a (it builds, its
products are tf32 ``wgmma``s, nothing spills, its shared memory fits an SM); on the GPU each
pass is held to the Triton kernel's (the same products of the same tf32-truncated operands,
accumulated in another order) on the inputs a real backward hands it, and the whole
backward's gradients with it to those with the Triton pass."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from kdalab.arith import rel_rmse  # noqa: E402
from kdalab.kernels import KernelConfig  # noqa: E402
from kdalab.kernels import chunk_recurrent_bwd_ws as ws  # noqa: E402
from tests.test_kernels_ws import _sm90_report  # noqa: E402

gpu = pytest.mark.gpu


@pytest.mark.parametrize("K,pass_,seg,varlen,dtype,nwg", [
    (128, 3, False, False, "fp16", 1), (128, 1, True, False, "fp16", 1),
    (128, 3, True, True, "fp16", 1), (64, 3, False, True, "fp16", 1),
    (128, 3, False, False, "fp32", 1), (128, 3, True, False, "fp16", 2),
    (128, 1, True, True, "fp16", 2)])
def test_bwd_ws_compiles_for_sm90a(K, pass_, seg, varlen, dtype, nwg):
    # ptxas (shipped with triton) for sm_90a. Per chunk, tf32 wgmma (k = 8): dS^T [KEND_hi |
    # KLO]^T over K as one N = 32 product (K / 8), dO^T MQK into the same accumulator, dO^T QG
    # and dU^T W over the chunk's 16 tokens (2 each): 22 at K = 128, 14 at K = 64 (the two
    # N = 16 products of the first form: 38 and 22). Measured (triton 3.9 and 3.6): 168
    # registers, no spills, 116,168 bytes of shared memory at K = 128 with fp16 operands (two
    # stages of each ring). Two value blocks a program (two compute warpgroups): twice the
    # products, 128 registers at launch (13 warps), spills (68-72 bytes at the partitions'
    # register split chosen, 184 / 24 / 104 for the second compute warpgroup, the loader and
    # the converter), 128,508 bytes of shared memory
    rep = _sm90_report()
    row = rep.report(ws.chunk_kda_bwd_recurrent_ws_kernel, rep.bwd_ws_signature(K, dtype),
                     dict(K=K, V=128, BV=64, CKC=4, NUM_STAGES=2, CONV_STAGES=2,
                          HAS_DHT=True, STATE_VK=False, IS_VARLEN=varlen, PASS=pass_,
                          SEG=seg, NWG=nwg, num_warps=4), num_warps=4)
    assert nwg == 2 or (row["spill_st"] == 0 and row["spill_ld"] == 0), row
    _compiled(row, spills=128, wgmma=nwg * (K // 8 + 6))


def _compiled(row, *, spills, wgmma):
    """An sm_90a report's row: it built, spilled at most ``spills`` bytes a thread, has
    ``wgmma`` tensor-core products (no mma.sync), and fits an SM's shared memory."""
    assert row["regs"] is not None, row
    assert row["spill_st"] <= spills, row
    assert row["wgmma"] == wgmma, row
    assert row["mma"] == 0, row
    assert row["smem"] <= 227 * 1024, row


def _cpu_ops(B, T, H, K):
    """Stage 1's seven operands (fp16 W, QG, KEND, KLO, AINV, MQK; fp32 GAMMA) on the CPU."""
    ops = [torch.zeros(B, T, H, K, dtype=torch.float16) for _ in range(4)]
    return ops + [torch.zeros(4, H, 16, 16, dtype=torch.float16)] * 2 + [torch.zeros(4, H, K)]


def test_bwd_ws_applies_only_where_it_can():
    B, T, H, K, V = 1, 32, 2, 128, 128
    ops = _cpu_ops(B, T, H, K)
    do = torch.zeros(B, T, H, V, dtype=torch.bfloat16)
    # the CPU (Gluon has no interpreter), tf32x3 products, bf16 dS operands, K 32, V 96
    assert not ws.applies(do, ops, precision="tf32", ds_dtype=torch.float32)
    if torch.cuda.is_available():
        cuda = [x.cuda() for x in ops]
        assert ws.applies(do.cuda(), cuda, precision="tf32", ds_dtype=torch.float32)
        assert not ws.applies(do.cuda(), cuda, precision="tf32x3", ds_dtype=torch.float32)
        assert not ws.applies(do.cuda(), cuda, precision="tf32", ds_dtype=torch.bfloat16)
        assert not ws.applies(do.cuda()[..., :96], cuda, precision="tf32",
                              ds_dtype=torch.float32)
        short = [x[..., :32] if x.shape[-1] == K else x for x in cuda]
        assert not ws.applies(do.cuda(), short, precision="tf32", ds_dtype=torch.float32)


@pytest.mark.parametrize("nv,items,V,asked,want", [
    (2, 64, 128, 0, 1),    # T 8192 H 64 serial: 128 one-block programs fit 132 SMs
    (2, 128, 128, 0, 2),   # T 4096 H 16, 32-chunk segments, pass 3: 256 would queue
    (4, 112, 128, 0, 2),   # its pass 1 (V + K rows: blocks 0-1 values', 2-3 the transition's)
    (3, 200, 64, 0, 1),    # V 64, K 128, pass 1: a pair would mix dO rows with the transition's
    (5, 200, 192, 0, 1),   # V 192: odd
    (2, 8, 128, 2, 2), (2, 512, 128, 1, 1)])  # asked
def test_bwd_ws_value_blocks_a_program(nv, items, V, asked, want):
    assert ws.value_blocks_a_program(nv, items, V, 132, asked) == want


# ---------------------------------------------------------------------------------------------
# GPU: the passes against the Triton kernel's, on a real backward's inputs

def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (wgmma)")

# The two kernels multiply the same tf32-truncated operands and differ in the order of the
# fp32 sums (the Triton kernel adds dS^T KEND_hi^T, dS^T KLO^T and dO^T MQK as separate
# products, this one accumulates them in one chain), so each step's dS differs in its last
# bits, and the next truncation to tf32 (10 bits) can flip on those: relative differences of
# about 2^-11 on the flipped elements, 1e-6 .. 1e-5 over a tensor. 1e-4 leaves that margin;
# a wrong operand, sign or stage (a chunk off by one, KLO left out, a row not zeroed past a
# sequence's end) gives 1e-3 and more.
PASS_TOL = 1e-4


def _grad_case(B, T, H, K, V, *, cu=None, gate="lower_bound", layout="KV", seed=3,
               dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), beta=r(B, T, H))
    kw = dict(lower_bound=-5.0 if gate == "lower_bound" else None)
    x["g"] = r(B, T, H, K)
    x["A_log"] = r(H) * 0.3
    x["dt_bias"] = r(H * K) * 0.3
    n = B if cu is None else len(cu) - 1
    shape = (n, H, K, V) if layout == "KV" else (n, H, V, K)
    x["initial_state"] = r(*shape) * 0.5
    x = {k_: t.cuda().to(dtype if k_ in ("q", "k", "v", "g", "beta") else t.dtype)
         for k_, t in x.items()}
    for t in x.values():
        t.requires_grad_(True)
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, device="cuda")
    kw["state_layout"] = layout
    return x, kw


def _backward(x, kw, config=KernelConfig()):
    from kdalab.kernels import chunk_kda

    o, s = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                     dt_bias=x["dt_bias"], initial_state=x["initial_state"],
                     output_final_state=True, config=config, **kw)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(o)
    dht = torch.randn(s.shape, generator=gen).to(s)
    for t in x.values():
        t.grad = None
    ((o.float() * do.float()).sum() + (s.float() * dht.float()).sum()).backward()
    return {k_: t.grad.clone() for k_, t in x.items()}


CASES = {
    "serial": (dict(B=2, T=512, H=2, K=128, V=128), dict(segment_chunks=0)),
    "segments": (dict(B=1, T=1024, H=2, K=128, V=128), dict(segment_chunks=16)),
    "varlen": (dict(B=1, T=600, H=2, K=128, V=128, cu=[0, 0, 37, 300, 301, 600]),
               dict(segment_chunks=8)),
    "k64_vk": (dict(B=1, T=300, H=3, K=64, V=128, layout="VK"), dict(segment_chunks=0)),
    "unbounded": (dict(B=1, T=256, H=2, K=128, V=64, gate="unbounded"),
                  dict(segment_chunks=8)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("warpgroups", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_bwd_ws_passes_match_the_triton_kernel(name, warpgroups, monkeypatch):
    """Each dS pass the backward launches, run by both kernels on the same inputs: dU and the
    block-end gradients within PASS_TOL (above) of the Triton kernel's; then the whole
    backward's gradients with the Gluon pass within 1e-3 of those with the Triton pass (bf16
    inputs, whose gradients are rounded to bf16: 2^-9 = 2e-3 is one rounding step, and a
    handful of flips over a tensor stay below 1e-3 in rel. RMS)."""
    from kdalab.kernels import autograd
    from kdalab.kernels import chunk_recurrent_bwd as crb

    shape, config = CASES[name]
    x, kw = _grad_case(**shape)
    seen = []
    real = crb.chunk_kda_bwd_recurrent

    def both(do, ops, **kwargs):
        kwargs.pop("gluon", None)
        ref_du, ref_ends = real(do, ops, gluon=False, **kwargs)
        got_du, got_ends = real(do, ops, gluon=warpgroups, **kwargs)
        seen.append((float(rel_rmse(got_du, ref_du, 4)), float(rel_rmse(got_ends, ref_ends, 4)),
                     ws.applies(do, ops, precision=kwargs["precision"],
                                ds_dtype=kwargs["ds_dtype"])))
        return got_du, got_ends

    monkeypatch.setattr(autograd, "chunk_kda_bwd_recurrent", both)
    _backward(x, kw, KernelConfig(**config))
    assert seen and all(a for *_, a in seen), seen  # the Gluon kernel ran
    assert all(e_du < PASS_TOL and e_ends < PASS_TOL for e_du, e_ends, _ in seen), seen
    monkeypatch.undo()

    monkeypatch.setitem(autograd.BWD_MODE, "ds_gluon", 0)
    want = _backward(x, kw, KernelConfig(**config))
    monkeypatch.setitem(autograd.BWD_MODE, "ds_gluon", warpgroups)
    got = _backward(x, kw, KernelConfig(**config))
    errors = {n: float(rel_rmse(got[n].float(), want[n].float(), got[n].dim())) for n in got}
    assert all(e < 1e-3 for e in errors.values()), str(errors)


# ---------------------------------------------------------------------------------------------
# The blocks kernel in Gluon (kernels/chunk_blocks_bwd_ws.py)

def _blocks_signature(dtype="fp16"):
    sig = dict(v_ptr="*bf16", do_ptr="*bf16", du_ptr="*fp32", ainv_ptr=f"*{dtype}",
               ck_offsets_ptr="*i32", seg_ptr="*i32", n_items="i32", H="i32")
    sig.update({f"{n}_ptr": f"*{dtype}" for n in ("w", "qg", "kend", "klo")})
    sig.update({f"{n}_ptr": "*fp32" for n in (
        "gamma", "h0", "ck", "ends", "dqg", "dw", "dkend", "dgam", "dmqk", "dh0", "scratch")})
    return sig


@pytest.mark.parametrize("V,dtype,vk", [(128, "fp16", False), (128, "fp32", True),
                                        (64, "fp16", False)])
def test_blocks_ws_compiles_for_sm90a(V, dtype, vk):
    # ptxas (shipped with triton) for sm_90a, K = 128. Per chunk, tf32 wgmma (k = 8), counted
    # as a warpgroup's instructions: forward V^T AINV^T (2), S^T W^T (16), S dO^T and S dU^T
    # (M = K over V: K / 8 each, at V = 128 a warpgroup's 64 rows, at V = 64 both M halves),
    # the state's update (3 x 2); back dS U^T (K / 8), dO^T QG and dU^T W (2 each): 76.
    # Measured (triton 3.9): V = 128 on 8 warps 255 registers, 204 bytes of spills, 201,728
    # bytes of shared memory; V = 64 on 4 warps 336 bytes of spills, 113,664 bytes
    from kdalab.kernels import chunk_blocks_bwd_ws as bw

    rep = _sm90_report()
    row = rep.report(bw.chunk_kda_bwd_blocks_ws_kernel, _blocks_signature(dtype),
                     dict(K=128, V=V, CKC=4, HAS_H0=True, STORE_DH0=True, STATE_VK=vk,
                          num_warps=V // 16), num_warps=V // 16)
    _compiled(row, spills=512, wgmma=2 + 4 * 128 // 8 + 6 + 4)  # M = K: K / 8 a warpgroup


def test_blocks_ws_applies_only_where_it_can():
    from kdalab.kernels import chunk_blocks_bwd_ws as bw

    B, T, H, K, V = 1, 32, 2, 128, 128
    ops = _cpu_ops(B, T, H, K)
    v = torch.zeros(B, T, H, V, dtype=torch.bfloat16)
    du = torch.zeros(B, T, H, V)
    kw = dict(precision="tf32", s_dtype=torch.float32, ds_dtype=torch.float32)
    assert not bw.applies(v, v, du, ops, **kw)  # the CPU
    if torch.cuda.is_available():
        c = [x.cuda() for x in ops]
        vc, duc = v.cuda(), du.cuda()
        assert bw.applies(vc, vc, duc, c, **kw)
        assert bw.applies(vc[..., :64].contiguous(), vc[..., :64].contiguous(),
                          duc[..., :64].contiguous(), c, **kw)
        assert not bw.applies(vc, vc, duc, c, **dict(kw, precision="tf32x3"))
        assert not bw.applies(vc, vc, duc, c, **dict(kw, s_dtype=torch.bfloat16))
        assert not bw.applies(vc[..., :96], vc[..., :96], duc[..., :96], c, **kw)
        short = [x[..., :64].contiguous() if x.shape[-1] == K else x for x in c]
        assert not bw.applies(vc, vc, duc, short, **kw)


# The two kernels multiply the same tf32-truncated operands (dMQK: exact fp32 products here)
# and sum in other orders; S's and dS's fp32 rounding differences pass through the next
# truncation to tf32 as for the dS pass (PASS_TOL above).
BLOCKS_CASES = {
    "serial": (dict(B=2, T=512, H=2, K=128, V=128), dict(segment_chunks=0)),
    "varlen": (dict(B=1, T=600, H=2, K=128, V=128, cu=[0, 0, 37, 300, 301, 600]),
               dict(segment_chunks=8)),
    "vk_v64": (dict(B=1, T=300, H=3, K=128, V=64, layout="VK"), dict(segment_chunks=0)),
    "unbounded": (dict(B=1, T=256, H=2, K=128, V=128, gate="unbounded"),
                  dict(segment_chunks=8)),
}


@gpu
@needs_hopper
@pytest.mark.parametrize("name", list(BLOCKS_CASES))
def test_gpu_blocks_ws_matches_the_triton_kernel(name, monkeypatch):
    """The blocks kernel's outputs by both kernels on the inputs a real backward hands it
    (dQG, dW, dKEND, dγ, dMQK, dh0 within PASS_TOL of the Triton kernel's; the Gluon kernel's
    programs each running several items), then the whole backward's gradients within 1e-3
    (as the dS pass's test above)."""
    from kdalab.kernels import autograd
    from kdalab.kernels import chunk_blocks_bwd as cbb
    from kdalab.kernels import chunk_blocks_bwd_ws as bw

    shape, config = BLOCKS_CASES[name]
    x, kw = _grad_case(**shape)
    seen = []
    real = cbb.chunk_kda_bwd_blocks

    def both(v, do, ops, du, ends, **kwargs):
        kwargs.pop("gluon", None)
        ref = real(v, do, ops, du.clone(), ends, gluon=False, **kwargs)
        ran = bw.applies(v, do, du, ops, precision=kwargs["precision"],
                         s_dtype=kwargs["s_dtype"], ds_dtype=kwargs["ds_dtype"])
        # on 3 "SMs": the persistent programs run several items each (a form that passed
        # with at most one item a program faulted at T 4096 H 16: docs/training.md)
        got = real(v, do, ops, du, ends, gluon=True, **dict(kwargs, sms=3))
        errs = {}
        for n, r in ref.items():
            if r is None:
                continue
            r = r.sum(0) if n not in ("dv", "dh0") else r
            g = got[n].sum(0) if n not in ("dv", "dh0") else got[n]
            errs[n] = float(rel_rmse(g.float(), r.float(), g.dim()))
        seen.append((errs, ran))
        return got

    monkeypatch.setattr(autograd, "chunk_kda_bwd_blocks", both)
    _backward(x, kw, KernelConfig(**config))
    assert seen and all(ran for _, ran in seen), seen  # the Gluon kernel ran
    assert all(e < PASS_TOL for errs, _ in seen for e in errs.values()), str(seen)
    monkeypatch.undo()

    monkeypatch.setitem(autograd.BWD_MODE, "blocks_gluon", 0)
    want = _backward(x, kw, KernelConfig(**config))
    monkeypatch.setitem(autograd.BWD_MODE, "blocks_gluon", 1)
    got = _backward(x, kw, KernelConfig(**config))
    errors = {n: float(rel_rmse(got[n].float(), want[n].float(), got[n].dim())) for n in got}
    assert all(e < 1e-3 for e in errors.values()), str(errors)

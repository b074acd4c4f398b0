"""chunk_kda_fwd through a state pool, its checkpoints and GVA, against the fp64 recurrence and
against itself: the pool path equals the initial_state path bit for bit, rows no index names
are untouched, every checkpoint equals the final state of a prefill of its prefix (serial and
split passes), GVA matches the reference. Interpreter tests run in one TRITON_INTERPRET=1
child (tests/test_decode.py::test_interpreter_suite)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from kdalab.kda import reference_forward  # noqa: E402
from kdalab.kernels import KernelConfig, checkpoint_offsets, chunk_kda_fwd  # noqa: E402
from tests.serving_inputs import INTERP, err, inputs, pool, stage1_clamped_and_masked  # noqa: E402

interp = pytest.mark.skipif(not INTERP, reason="runs in the TRITON_INTERPRET=1 child process")
gpu = pytest.mark.gpu
# fp32 outputs against fp64 in the interpreter (fp16 product operands): as tests/test_kernels.py
TOL_FP32 = 3e-3
SPLIT = KernelConfig(segment_chunks=1)  # the sequence-parallel passes, a segment a chunk


def _prefix_state(x, n, length, h0, kw, config):
    q, k, v, g, beta = (t[n:n + 1, :length] for t in x)
    _, s = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                         config=config, **kw)
    return s[0]


@interp
@pytest.mark.parametrize("config,layout", [
    (KernelConfig(), "KV"), (KernelConfig(), "VK"), (SPLIT, "KV"),
    # a value block wider than V (the descriptor's box past V is dropped)
    (KernelConfig(block_v=32), "VK")],
    ids=["serial", "serial-VK", "split", "serial-VK-bv32"])
def test_interp_pool_prefill_and_checkpoints(config, layout):
    N, T, H, HV, K, V = 2, 40, 1, 2, 16, 16
    q, k, v, g, beta, kw = inputs(N, T, H, HV, K, V, seed=2)
    p = pool(5, HV, K, V, layout=layout)
    before = p.clone()
    idx = torch.tensor([3, 1])
    o, final, ck = chunk_kda_fwd(q, k, v, g, beta, state_pool=p, state_indices=idx,
                                 checkpoint_every=16, state_layout=layout, config=config, **kw)
    assert final is None and ck.shape == ((N * (T // 16), HV) + tuple(p.shape[2:]))
    o2, f2 = chunk_kda_fwd(q, k, v, g, beta, initial_state=before[idx],
                           output_final_state=True, state_layout=layout, config=config, **kw)
    assert torch.equal(o, o2) and torch.equal(p[idx], f2)   # the pool path is the same call
    assert torch.equal(p[[0, 2, 4]], before[[0, 2, 4]])     # untouched rows, bit for bit
    ro, rs = reference_forward(q, k, v, g, beta, initial_state=before[idx],
                               output_final_state=True, state_layout=layout, **kw)
    assert err(o, ro) < TOL_FP32 and err(f2, rs) < TOL_FP32
    x = (q, k, v, g, beta)
    for n in range(N):
        for j in (1, 2):  # tokens 16 and 32 of 40
            want = _prefix_state(x, n, 16 * j, before[idx[n:n + 1]], dict(kw, state_layout=layout),
                                 KernelConfig())
            got = ck[n * 2 + j - 1]
            if config == SPLIT:  # composed differently: fp16 roundings of M and R
                assert err(got, want) < 1e-3
            else:
                assert torch.equal(got, want)


@interp
def test_interp_checkpoint_at_the_end_is_the_final_state():
    # a sequence ending on a checkpoint stores it after the recurrent loop (the others are
    # stored at the top of the next chunk's step): the last row is the final state, bit for bit
    N, T, H, K, V = 2, 32, 1, 16, 16
    q, k, v, g, beta, kw = inputs(N, T, H, H, K, V, seed=3)
    h0 = pool(N, H, K, V)
    o, f, ck = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                             checkpoint_every=16, **kw)
    for n in range(N):
        assert torch.equal(ck[2 * n + 1], f[n])
        assert torch.equal(ck[2 * n], _prefix_state((q, k, v, g, beta), n, 16, h0[n:n + 1],
                                                    kw, KernelConfig()))


@interp
@pytest.mark.parametrize("split", [False, True], ids=["serial", "split"])
def test_interp_pool_fp16_guard_in_a_second_launch(split):
    # a head whose values overflow fp16, through the pool (read and written in place): the
    # guard's redo in a second launch must find the pool row's start state intact (the first
    # launch writes no non-finite final state), so it gives the in-launch redo's bits
    N, T, H, K, V = 2, 40, 2, 16, 16
    q, k, v, g, beta, kw = inputs(N, T, H, H, K, V, seed=6)
    v[:, :, 1] *= 3e5
    idx = torch.tensor([2, 0])
    out = {}
    for guard in ("inline", "launch"):
        p = pool(3, H, K, V)
        config = KernelConfig(fp16_guard=guard, segment_chunks=1 if split else 0)
        o, _, ck = chunk_kda_fwd(q, k, v, g, beta, state_pool=p, state_indices=idx,
                                 checkpoint_every=16, config=config, **kw)
        out[guard] = (o, p, ck)
    assert out["inline"][1].isfinite().all()
    for a, b in zip(out["inline"], out["launch"]):
        assert torch.equal(a, b)


@interp
def test_interp_checkpoints_packed_sequences():
    # lengths 35, 0, 30, 56 with checkpoints every 32 tokens: 1 + 0 + 0 + 1 rows of the
    # T // 32 = 3 allotted (the third zero)
    cu = torch.tensor([0, 35, 35, 65, 121], dtype=torch.int32)
    q, k, v, g, beta, kw = inputs(1, 121, 1, 1, 16, 16, seed=4)
    h0 = pool(4, 1, 16, 16)
    o, f, ck = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                             cu_seqlens=cu, checkpoint_every=32, **kw)
    assert ck.shape[0] == 121 // 32
    assert checkpoint_offsets(cu, 32).tolist() == [0, 1, 1, 1]
    for row, n in enumerate([0, 3]):
        s = cu[n]
        xs = [t[:, s:s + 32] for t in (q, k, v, g, beta)]
        _, want = chunk_kda_fwd(*xs, initial_state=h0[n:n + 1], output_final_state=True, **kw)
        assert torch.equal(ck[row], want[0])
    assert not ck[2].any()


@interp
@pytest.mark.parametrize("gate_heads", [None, 2], ids=["gate-per-v-head", "gate-per-qk-head"])
def test_interp_gva_prefill(gate_heads):
    q, k, v, g, beta, kw = inputs(1, 37, 2, 4, 16, 32, seed=6, gate_heads=gate_heads)
    h0 = pool(1, 4, 16, 32)
    o, s = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    ro, rs = reference_forward(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               **kw)
    assert err(o, ro) < TOL_FP32 and err(s, rs) < TOL_FP32
    # stage 1's rows clamped to the sequence (T = 37: a ragged tail) give the masked loads'
    # operands, bit for bit, under GVA too
    clamped, masked = stage1_clamped_and_masked(q, k, g, beta, **kw)
    assert all(torch.equal(a, b) for a, b in zip(clamped, masked, strict=True))
    # GVA only changes which q/k (and gate) rows stage 1 reads: the heads repeated by hand
    # give the same bits
    rep = lambda x: x.repeat_interleave(2, dim=2)  # noqa: E731
    kw_rep = dict(kw)
    if gate_heads:
        g = rep(g)
        kw_rep.update(A_log=kw["A_log"].repeat_interleave(2),
                      dt_bias=kw["dt_bias"].view(2, 16).repeat_interleave(2, 0).flatten())
    o2, s2 = chunk_kda_fwd(rep(q), rep(k), v, g, beta, initial_state=h0,
                           output_final_state=True, **kw_rep)
    assert torch.equal(o, o2) and torch.equal(s, s2)


@interp
def test_interp_pool_negative_index_and_bf16_pool():
    q, k, v, g, beta, kw = inputs(2, 20, 1, 1, 16, 16)
    p = pool(3, 1, 16, 16, dtype=torch.bfloat16)
    before = p.clone()
    o, _ = chunk_kda_fwd(q, k, v, g, beta, state_pool=p, state_indices=torch.tensor([-1, 2]),
                         **kw)
    assert torch.equal(p[:2], before[:2])  # the padded slot writes nothing
    o0, _ = chunk_kda_fwd(q[:1], k[:1], v[:1], g[:1], beta[:1], **kw)  # from a zero state
    assert torch.equal(o[:1], o0)
    _, f = chunk_kda_fwd(q[1:], k[1:], v[1:], g[1:], beta[1:], initial_state=before[2:],
                         output_final_state=True, **kw)
    assert torch.equal(p[2], f[0]) and f.dtype == torch.bfloat16


# ------------------------------------------------------------ argument checks (no launch)

@pytest.mark.parametrize("change,match", [
    (dict(state_indices=None), "state_pool and state_indices"),
    (dict(initial_state=torch.zeros(2, 1, 16, 16)), "initial_state"),
    (dict(state_pool=torch.zeros(3, 1, 16, 8)), "state_pool"),
    (dict(state_pool=torch.zeros(3, 1, 16, 16).transpose(2, 3)), "contiguous"),
    (dict(state_indices=torch.tensor([0, 1, 2])), "state_indices"),
    (dict(checkpoint_every=24), "checkpoint_every"),
])
def test_pool_rejects_bad_arguments(change, match):
    q, k, v, g, beta, kw = inputs(2, 20, 1, 1, 16, 16)
    args = dict(state_pool=torch.zeros(3, 1, 16, 16), state_indices=torch.tensor([0, 1]), **kw)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        chunk_kda_fwd(q, k, v, g, beta, **args)


# ------------------------------------------------------------ GPU

@gpu
@pytest.mark.parametrize("T,H", [(1024, 16), (131072, 4)])
def test_pool_gpu_checkpoints_match_prefix_runs(T, H):
    """At full shapes (serial pass, and the split pass at T = 131072 H = 4): pool path ==
    initial_state path bit for bit, checkpoints == prefix prefills (serial: bit for bit)."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(2 if T <= 4096 else 1, T, H, H, 128, 128, seed=1,
                                  device=dev, dtype=torch.bfloat16)
    kw["lower_bound"] = -5.0
    N = q.shape[0]
    p = pool(N + 2, H, 128, 128, device=dev)
    before = p.clone()
    idx = torch.arange(N, device=dev) + 2
    o, _, ck = chunk_kda_fwd(q, k, v, g, beta, state_pool=p, state_indices=idx,
                             checkpoint_every=512, **kw)
    o2, f2 = chunk_kda_fwd(q, k, v, g, beta, initial_state=before[idx],
                           output_final_state=True, **kw)
    assert torch.equal(o, o2) and torch.equal(p[idx], f2)
    assert torch.equal(p[:2], before[:2])
    per = T // 512
    for n in range(N):
        for j in (1, per // 2, per - 1):
            L = 512 * j
            _, want = chunk_kda_fwd(*(x[n:n + 1, :L] for x in (q, k, v, g, beta)),
                                    initial_state=before[idx[n:n + 1]], output_final_state=True,
                                    **kw)
            assert err(ck[n * per + j - 1], want[0]) < 1e-3


@gpu
@pytest.mark.parametrize("layout", ["KV", "VK"])
def test_pool_gpu_checkpoints_guard_modes_agree(layout):
    """The checkpoints (stored through the tensor descriptor) with the guard inline and in a
    second launch, serial and split passes, fp32 and bf16 pools, value blocks of 64 and 128:
    the same bits. The sequence ends on a checkpoint (its last row is the final state)."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(2, 2048, 4, 4, 128, 128, seed=5, device=dev,
                                  dtype=torch.bfloat16)
    kw.update(lower_bound=-5.0, state_layout=layout, checkpoint_every=128)
    for dtype in (torch.float32, torch.bfloat16):
        h0 = pool(2, 4, 128, 128, device=dev, layout=layout).to(dtype)
        for base in (KernelConfig(segment_chunks=0), KernelConfig(segment_chunks=32),
                     KernelConfig(segment_chunks=0, block_v=128, num_warps=8)):
            runs = [chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  config=dataclasses.replace(base, **change), **kw)
                    for change in (dict(fp16_guard="inline"), dict(fp16_guard="launch"))]
            o, f, ck = runs[0]
            assert torch.equal(ck[15], f[0]) and torch.equal(ck[31], f[1]), (dtype, base)
            for other in runs[1:]:
                assert all(torch.equal(a, b) for a, b in zip(runs[0], other)), (dtype, base)


@gpu
@pytest.mark.parametrize("gate_heads", [None, 4], ids=["gate-per-v-head", "gate-per-qk-head"])
def test_gva_gpu_matches_fp64(gate_heads):
    """GVA at full size (H = 4 q/k heads, HV = 16 value heads, K = V = 128, bf16): the output
    and state errors against fp64 within tests/test_kernels.py's GPU bound, and the same
    bits as the heads repeated by hand (GVA only changes which q/k row stage 1 reads)."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(2, 2000, 4, 16, 128, 128, seed=3, device=dev,
                                  dtype=torch.bfloat16, gate_heads=gate_heads)
    kw["lower_bound"] = -5.0
    h0 = pool(2, 16, 128, 128, device=dev) * 0.1
    o, s = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    ro, rs = reference_forward(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               **kw)
    assert err(o, ro) < 3.5e-3 and err(s, rs) < 3.5e-3
    rep = lambda x: x.repeat_interleave(4, dim=2)  # noqa: E731
    kw_rep = dict(kw)
    if gate_heads:
        g = rep(g)
        kw_rep.update(A_log=kw["A_log"].repeat_interleave(4),
                      dt_bias=kw["dt_bias"].view(4, 128).repeat_interleave(4, 0).flatten())
    o2, s2 = chunk_kda_fwd(rep(q), rep(k), v, g, beta, initial_state=h0,
                           output_final_state=True, **kw_rep)
    assert torch.equal(o, o2) and torch.equal(s, s2)

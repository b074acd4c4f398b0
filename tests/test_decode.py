"""kdalab.kernels.kda_decode against the fp64 token recurrence (``reference_forward``): pool
rows by index, untouched rows bit for bit, per-token states and accepted tokens (speculative
decoding), negative indices, GVA, both state layouts, packed sequences, no drift over many
steps, and decode followed by decode against one prefill. Interpreter tests (``interp_``) run
in one TRITON_INTERPRET=1 child (``test_interpreter_suite``; tests/serving_inputs.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kdalab.kda import reference_forward  # noqa: E402
from kdalab.kernels import KernelConfig, chunk_kda_fwd, kda_decode  # noqa: E402
from tests.serving_inputs import INTERP, err, inputs, pool, run_interpreter_tests  # noqa: E402

interp = pytest.mark.skipif(not INTERP, reason="runs in the TRITON_INTERPRET=1 child process")
gpu = pytest.mark.gpu
# fp32 decode against fp64: the same recurrence in fp32 (unit roundoff 6e-8) over a few tokens,
# measured 1e-7 .. 6e-7 relative; 1e-5 leaves a 15x margin while a wrong state row, gate head
# or token order is off by >= 1e-1
TOL_DECODE = 1e-5


def _ref(q, k, v, g, beta, state, kw, layout="KV", cu_seqlens=None):
    return reference_forward(q, k, v, g, beta, initial_state=state, output_final_state=True,
                             state_layout=layout, cu_seqlens=cu_seqlens, **kw)


@interp
@pytest.mark.parametrize("layout", ["KV", "VK"])
@pytest.mark.parametrize("H,HV,gate_heads,T", [(2, 2, None, 1), (1, 2, None, 3), (2, 4, 2, 2)])
def test_interp_decode_matches_fp64(layout, H, HV, gate_heads, T):
    q, k, v, g, beta, kw = inputs(3, T, H, HV, 16, 32, gate_heads=gate_heads)
    p = pool(6, HV, 16, 32, layout=layout)
    before = p.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    o = kda_decode(q, k, v, g, beta, state_pool=p, state_indices=idx, state_layout=layout, **kw)
    ro, rs = _ref(q, k, v, g, beta, before[idx.long()], kw, layout)
    assert o.shape == v.shape and o.dtype == v.dtype
    assert err(o, ro) < TOL_DECODE and err(p[idx.long()], rs) < TOL_DECODE
    assert torch.equal(p[[1, 3, 5]], before[[1, 3, 5]])  # rows no index names: untouched


@interp
def test_interp_decode_per_token_states_and_accepted_tokens():
    # speculative decoding: 3 draft tokens, the state after each goes to its own row; the
    # next step starts from the row of the last accepted token
    q, k, v, g, beta, kw = inputs(2, 3, 2, 2, 16, 16)
    p = pool(8, 2, 16, 16)
    before = p.clone()
    idx = torch.tensor([[0, 1, 2], [5, 6, 7]])
    kda_decode(q, k, v, g, beta, state_pool=p, state_indices=idx, **kw)
    for t in range(3):
        _, rs = _ref(*(x[:, :t + 1] for x in (q, k, v, g, beta)), before[[0, 5]], kw)
        assert err(p[idx[:, t]], rs) < TOL_DECODE
    assert torch.equal(p[[3, 4]], before[[3, 4]])
    # accepted 2 of seq 0's drafts and 1 of seq 1's: the next step (same rows) starts from
    # columns 1 and 0 (rows 1 and 5) and writes its one token's state to column 0
    q2, k2, v2, g2, b2, _ = inputs(2, 1, 2, 2, 16, 16, seed=3)
    starts = p[[1, 5]].clone()
    idx2 = idx
    o = kda_decode(q2, k2, v2, g2, b2, state_pool=p, state_indices=idx2,
                   num_accepted_tokens=torch.tensor([2, 1]), **kw)
    ro, rs = _ref(q2, k2, v2, g2, b2, starts, kw)
    assert err(o, ro) < TOL_DECODE and err(p[[0, 5]], rs) < TOL_DECODE


@interp
def test_interp_decode_negative_index_skips_the_pool():
    q, k, v, g, beta, kw = inputs(2, 1, 2, 2, 16, 16)
    p = pool(3, 2, 16, 16)
    before = p.clone()
    o = kda_decode(q, k, v, g, beta, state_pool=p, state_indices=torch.tensor([-1, 1]), **kw)
    assert torch.equal(p[[0, 2]], before[[0, 2]])
    ro, _ = _ref(q[:1], k[:1], v[:1], g[:1], beta[:1], torch.zeros_like(p[:1]), kw)
    assert err(o[:1], ro) < TOL_DECODE  # a padded slot: computed from a zero state


@interp
def test_interp_decode_packed_sequences():
    cu = torch.tensor([0, 2, 2, 5])
    q, k, v, g, beta, kw = inputs(1, 5, 1, 2, 16, 16)
    p = pool(4, 2, 16, 16)
    before = p.clone()
    idx = torch.tensor([3, 0, 1])
    o = kda_decode(q, k, v, g, beta, state_pool=p, state_indices=idx, cu_seqlens=cu, **kw)
    keep = torch.tensor([0, 2])  # the reference takes no empty sequence
    ro, rs = _ref(q, k, v, g, beta, before[idx[keep]], kw, cu_seqlens=torch.tensor([0, 2, 5]))
    assert err(o, ro) < TOL_DECODE and err(p[idx[keep]], rs) < TOL_DECODE
    assert torch.equal(p[0], before[0]) and torch.equal(p[2], before[2])  # empty: untouched


@interp
def test_interp_decode_steps_match_one_prefill_and_do_not_drift():
    # 48 single-token steps (three chunks of the prefill) against the fp64 recurrence over
    # the same tokens and against one prefill of them (chunk_kda_fwd, fp16 product operands):
    # decode stays within fp32 rounding of fp64 at every step, inside the prefill's error;
    # 1000 steps at full size: the GPU test below
    T = 48
    q, k, v, g, beta, kw = inputs(2, T, 2, 2, 16, 16, seed=5)
    p = pool(2, 2, 16, 16)
    h0 = p.clone()
    outs = []
    for t in range(T):
        outs.append(kda_decode(*(x[:, t:t + 1] for x in (q, k, v, g, beta)), state_pool=p,
                               state_indices=torch.tensor([0, 1]), **kw))
    o = torch.cat(outs, 1)
    ro, rs = _ref(q, k, v, g, beta, h0, kw)
    po, ps = chunk_kda_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    first, last = err(o[:, :16], ro[:, :16]), err(o[:, -16:], ro[:, -16:])
    assert err(o, ro) < TOL_DECODE and err(p, rs) < TOL_DECODE
    assert last < TOL_DECODE and first < TOL_DECODE
    assert err(o, ro) < err(po, ro) and err(p, rs) < err(ps, rs)
    # decode then decode == one prefill, within the prefill's own error against fp64
    assert err(o, po) <= 2 * err(po, ro) and err(p, ps) <= 2 * err(ps, rs)


@interp
def test_interp_decode_bf16_pool():
    q, k, v, g, beta, kw = inputs(2, 2, 2, 2, 16, 16)
    p = pool(2, 2, 16, 16, dtype=torch.bfloat16)
    before = p.clone()
    o = kda_decode(q, k, v, g, beta, state_pool=p, state_indices=torch.tensor([1, 0]), **kw)
    ro, rs = _ref(q, k, v, g, beta, before[[1, 0]].float(), kw)
    # fp32 arithmetic, the state rounded to bf16 once on the store (the interpreter
    # truncates: 2^-8 = 3.9e-3 relative at worst)
    assert err(o, ro) < TOL_DECODE and err(p[[1, 0]].float(), rs) < 4e-3
    assert p.dtype == torch.bfloat16


# ------------------------------------------------------------ argument checks (no launch)

@pytest.mark.parametrize("change,match", [
    (dict(state_pool=torch.zeros(3, 2, 16, 8)), "state_pool"),
    (dict(state_indices=torch.zeros(3, dtype=torch.int64)), "state_indices"),
    (dict(state_indices=torch.zeros(2)), "state_indices"),
    (dict(lower_bound=0.5), "lower_bound"),
    (dict(gate="log"), "gate"),
    (dict(gate="log_decay"), "A_log"),  # g is the log-decay: no gate parameters
    (dict(state_layout="XY"), "state_layout"),
    (dict(num_accepted_tokens=torch.ones(2, dtype=torch.int64)), "num_accepted_tokens"),
    (dict(A_log=torch.zeros(3)), "A_log"),
    (dict(scale="0.1"), "scale"),
    (dict(scale=float("inf")), "scale"),
    (dict(use_qk_l2norm=1), "use_qk_l2norm"),
    (dict(config=dict(block_v=32)), "config"),
])
def test_decode_rejects_bad_arguments(change, match):
    q, k, v, g, beta, kw = inputs(2, 1, 2, 2, 16, 16)
    args = dict(state_pool=pool(3, 2, 16, 16), state_indices=torch.tensor([0, 1]), **kw)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        kda_decode(q, k, v, g, beta, **args)


def test_decode_rejects_gva_mismatch():
    q, k, v, g, beta, kw = inputs(2, 1, 2, 3, 16, 16)
    with pytest.raises(ValueError, match="v must"):
        kda_decode(q, k, v, g, beta, state_pool=pool(3, 3, 16, 16),
                   state_indices=torch.tensor([0, 1]), **kw)


def test_decode_launch_shape_rule():
    """The value block doubles from DECODE_WIDE_FROM programs on, on the same warps, and never
    past V nor on a 2-warp tile."""
    from kdalab.kernels.decode import DECODE_WIDE_FROM, decode_launch_shape
    assert decode_launch_shape(128, 128, 1) == (32, 4)
    assert decode_launch_shape(128, 128, DECODE_WIDE_FROM - 1) == (32, 4)
    assert decode_launch_shape(128, 128, DECODE_WIDE_FROM) == (64, 4)
    assert decode_launch_shape(128, 32, 10 ** 6) == (32, 4)   # 2 BV > V: unchanged
    assert decode_launch_shape(256, 256, 10 ** 6) == (32, 4)  # 16 -> 32 at K = 256
    assert decode_launch_shape(16, 16, 10 ** 6) == (16, 2)    # 2 warps: unchanged


def test_interpreter_suite(tmp_path):
    """Every ``interp_`` test of the serving test files, in one TRITON_INTERPRET=1 child."""
    if INTERP:
        pytest.skip("already interpreting: the interpreter tests run in this process")
    assert len(run_interpreter_tests(tmp_path)) >= 10


# ------------------------------------------------------------ GPU

@gpu
def test_decode_gpu_thousand_steps_stay_within_prefill_error():
    """1000 decode steps at K = V = 128 (bf16 inputs, fp32 pool) against the fp64 recurrence:
    the outputs of the last 100 steps are no worse than those of the first 100 (no drift)
    and every error is within the prefill's over the same tokens."""
    T, dev = 1000, "cuda"
    q, k, v, g, beta, kw = inputs(4, T, 4, 8, 128, 128, seed=7, device=dev,
                                  dtype=torch.bfloat16)
    kw["lower_bound"] = -5.0
    p = pool(6, 8, 128, 128, device=dev) * 0.1
    h0 = p[[5, 1, 3, 0]].clone()
    idx = torch.tensor([5, 1, 3, 0], device=dev)
    outs = [kda_decode(*(x[:, t:t + 1] for x in (q, k, v.float(), g, beta)), state_pool=p,
                       state_indices=idx, **kw) for t in range(T)]
    o = torch.cat(outs, 1)
    ro, rs = _ref(q, k, v.float(), g, beta, h0, kw)
    po, ps = chunk_kda_fwd(q, k, v.float(), g, beta, initial_state=h0, output_final_state=True,
                           **kw)
    e_first, e_last = err(o[:, :100], ro[:, :100]), err(o[:, -100:], ro[:, -100:])
    assert e_last <= max(2 * e_first, 1e-5), (e_first, e_last)
    assert err(o, ro) <= err(po, ro) and err(p[idx], rs) <= err(ps, rs)
    # decode then decode == one prefill within the floor rule: their difference is within
    # the prefill's own error against fp64 (x2: both errors add)
    assert err(o, po) <= 2 * err(po, ro)


@gpu
@pytest.mark.parametrize("T,layout", [(1, "KV"), (4, "VK"), (16, "KV")])
def test_decode_gpu_matches_fp64(T, layout):
    q, k, v, g, beta, kw = inputs(64, T, 16, 32, 128, 128, seed=T, device="cuda",
                                  dtype=torch.bfloat16)
    kw["lower_bound"] = -5.0
    p = pool(80, 32, 128, 128, layout=layout, device="cuda")
    before = p.clone()
    idx = torch.randperm(80, device="cuda")[:64]
    o = kda_decode(q, k, v, g, beta, state_pool=p, state_indices=idx, state_layout=layout,
                   **kw)
    ro, rs = _ref(q, k, v, g, beta, before[idx], kw, layout)
    rest = torch.ones(80, dtype=torch.bool, device="cuda")
    rest[idx] = False
    # bf16 outputs: the floor rule, the error of rounding the fp64 result to bf16 (about
    # 1.6e-3; the fp32 recurrence moves a few roundings: 10%); the state stays fp32
    floor = err(ro.to(o.dtype), ro)
    assert err(o, ro) <= 1.1 * floor and err(p[idx], rs) < 1e-5
    assert torch.equal(p[rest], before[rest])


@gpu
def test_decode_gpu_launch_shape_and_batch():
    """The launch shape moves which threads sum a column over K, so the fp32 state's last bits
    depend on it (seen on the H200: BV 32 and BV 64 differ). A pinned shape gives
    a sequence the same bits alone as in a batch of 200; the default (BV 32 alone,
    N · HV = 4; BV 64 in the batch, N · HV = 800) agrees within fp32 reassociation."""
    from kdalab.kernels.decode import DECODE_WIDE_FROM, decode_launch_shape
    N, dev = 200, "cuda"
    assert decode_launch_shape(128, 128, N * 4) != decode_launch_shape(128, 128, 4)
    assert N * 4 >= DECODE_WIDE_FROM
    q, k, v, g, beta, kw = inputs(N, 3, 2, 4, 128, 128, seed=11, device=dev,
                                  dtype=torch.bfloat16)
    kw["lower_bound"] = -5.0
    p0 = pool(N, 4, 128, 128, device=dev)
    idx = torch.arange(N, device=dev)
    for shape in (None, (32, 4), (64, 4), (16, 2)):
        bv, w = shape or (None, None)
        pb = p0.clone()
        config = KernelConfig(block_v=bv, num_warps=w)
        ob = kda_decode(q, k, v, g, beta, state_pool=pb, state_indices=idx, config=config,
                        **kw)
        for n in (0, 77, N - 1):
            p = p0.clone()
            o1 = kda_decode(*(x[n:n + 1] for x in (q, k, v, g, beta)), state_pool=p,
                            state_indices=idx[n:n + 1], config=config, **kw)
            if shape is not None:  # pinned: the batch around it changes nothing
                assert torch.equal(o1[0], ob[n]) and torch.equal(p[n], pb[n]), (shape, n)
            else:  # 128-term fp32 sums in another order over 3 tokens: the state a few
                # ulps (6e-8 each), far inside TOL_DECODE; o is bf16, where such a change can
                # flip an element's rounding by one ulp (2^-8 relative, the bound used); a
                # wrong row or head is off by >= 1e-1 in either
                assert err(o1[0].float(), ob[n].float()) <= 2 ** -8
                assert err(p[n], pb[n]) < TOL_DECODE

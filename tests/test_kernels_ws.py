"""The warp-specialized Gluon stage 2 (``kernels/chunk_recurrent_ws.py``, issue 43's prototype).

Gluon has no interpreter, so on the CPU the kernel is compiled for sm_90a (what CI can check:
it builds, its products are on the tensor cores, its shared memory and registers leave two
programs an SM); on the GPU it is held to the Triton kernel bit for bit (the same products,
operand types and accumulation chains: ``chunk_step``'s TTGIR and this kernel's have the same
``warp_group_dot`` chain and MMA layouts), which also keeps the fp16 guard bit-causal (the
guard's redo, Triton's second launch, repeats the first pass's fp16 steps and must get its
bits)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from kdalab.kda import reference_forward  # noqa: E402
from kdalab.kernels import KernelConfig, chunk_kda_fwd  # noqa: E402
from kdalab.kernels import chunk_recurrent_ws as ws  # noqa: E402
from tests.test_kernels import TOL_BF16_GPU, TOL_FP32, _err, _inputs, _state  # noqa: E402

gpu = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
# the Triton kernel in the form the prototype replaces: the serial pass, BV 64 on 4 warps,
# fp16 products, the guard's redo in a second launch
TRITON = KernelConfig(dot="fp16", segment_chunks=0, block_v=64, num_warps=4, fp16_guard="launch",
                      stage2="triton")
GLUON = KernelConfig(dot="fp16", segment_chunks=0, block_v=64, num_warps=4, stage2="gluon")


def _sm90_report():
    path = ROOT / "scripts" / "sm90_report.py"
    spec = importlib.util.spec_from_file_location("sm90_report", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("K,h0,varlen,ckc,pass_", [
    (128, True, False, 0, 0), (128, False, False, 0, 0), (64, True, False, 0, 0),
    (128, True, True, 4, 0), (128, True, False, 0, 1), (128, True, True, 4, 2)])
def test_ws_compiles_for_sm90a(K, h0, varlen, ckc, pass_):
    # ptxas (shipped with triton) for sm_90a: per chunk 8 + 8 wgmma for S^T W^T and S^T QG^T
    # over K = 128 in steps of 16 (4 + 4 at K = 64) and one each for V^T AINV^T, U^T MQK^T,
    # U^T KEND, U^T KLO; 128 registers a thread at launch (two programs an SM; the compute
    # warpgroup raises its own with setmaxnreg); the ring of 3 stages and two output tiles in
    # 62,796 bytes of shared memory at K = 128, and a checkpoint tile of 32 KB (fp32): two
    # programs fit an SM's 227 KB either way
    rep = _sm90_report()
    row = rep.report(ws.chunk_kda_recurrent_ws_kernel, rep.ws_signature(K),
                     dict(K=K, V=128, BV=64, NUM_STAGES=3, HAS_H0=h0, STORE_HT=h0,
                          STATE_VK=False, IS_VARLEN=varlen, HAS_IDX=ckc > 0, CKC=ckc,
                          FULL=not varlen, PASS=pass_, NV=(128 + K if pass_ == 1 else 128) // 64,
                          num_warps=4), num_warps=4,
                     maxnreg=128)
    assert row["regs"] is not None and row["regs"] <= 128, row
    # a summary (pass 1) has no outputs: no S^T QG^T, no U^T MQK^T
    assert row["wgmma"] == (20 if K == 128 else 12) - (9 if pass_ == 1 else 0), row
    assert 2 * row["smem"] <= 227 * 1024, row


def _ops(B, T, H, K, V, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    r = lambda *s, dt=torch.float16: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    w, qg, kend, klo = (r(B, T, H, K) for _ in range(4))
    n = B * T // 16 * H
    return (r(B, T, H, V, dt=dtype), w, qg, kend, klo, r(n, 16, 16), r(n, 16, 16),
            r(n, K, dt=torch.float32))


@pytest.mark.parametrize("change,match", [
    (dict(dot="tf32"), "fp16 products"), (dict(V=96), "multiple of 64"), (dict(K=32), "K 64"),
    (dict(dtype=torch.float32), "bf16 or fp16")])
def test_ws_refuses_what_it_does_not_cover(change, match):
    shape = dict(B=1, T=32, H=2, K=64, V=64)
    dot = change.pop("dot", "fp16")
    dtype = change.pop("dtype", torch.bfloat16)
    shape.update(change)
    v, *ops = _ops(**shape, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        ws.chunk_kda_recurrent_ws(v, *ops, initial_state=None, final_state=None,
                                  state_vk=False, cu_seqlens=None, chunk_offsets=None,
                                  num_seqs=1, block_v=64, num_warps=4, dot=dot, guard="launch")


class _Launches:
    """Stands in for the Gluon kernel on the CPU: records each launch's grid, arguments and
    constants, and writes ``flag`` into its flags (argument 13: nine descriptors, o, gamma,
    h0, ht, then the flags)."""

    def __init__(self, flag=0):
        self.calls, self.flag = [], flag

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, args, kw))
            args[13].fill_(self.flag)
        return launch


def _ws_call(monkeypatch, flag=0, B=2, T=1000, H=2, K=128, V=128, redo=None, **kw):
    """The wrapper's Gluon launches, recorded; the Triton redo's arguments go to ``redo``."""
    import kdalab.kernels.chunk_recurrent as cr

    rec = _Launches(flag)
    monkeypatch.setattr(ws, "chunk_kda_recurrent_ws_kernel", rec)
    monkeypatch.setattr(cr, "chunk_kda_recurrent",
                        lambda *a, **k: redo.append(k) if redo is not None else None)
    v, *ops = _ops(B, T, H, K, V)
    args = dict(initial_state=None, final_state=None, state_vk=False, cu_seqlens=None,
                chunk_offsets=None, num_seqs=B, block_v=128, num_warps=8, dot="fp16",
                guard="launch")
    ws.chunk_kda_recurrent_ws(v, *ops, **{**args, **kw})
    return rec.calls


def test_ws_host_side_grid_descriptors_and_constants(monkeypatch):
    # the launches the wrapper makes (no GPU: the kernel recorded, not run): its own tile (BV 64,
    # 4 warps, whatever the Triton plan's), a TMA box a chunk's rows of each operand at the
    # views the kernel indexes, FULL only where every chunk is whole
    # the grid: value blocks first, so that a (sequence, head)'s two start together
    (grid, args, kw), = _ws_call(monkeypatch)
    assert grid == (2, 2 * 2) and kw["NV"] == 2
    assert kw["PASS"] == 0 and kw["num_warps"] == 4
    assert kw["FULL"] is False and not kw["IS_VARLEN"] and kw["CKC"] == 0 and kw["BV"] == 64
    boxes = [list(d.block_shape) for d in args[:9]]
    assert boxes == [[16, 128]] * 4 + [[16, 64], [16, 16], [16, 16], [16, 64], [1, 128]]
    assert [list(d.shape) for d in args[:5]] == [[2000, 256]] * 5
    (_, _, kw), = _ws_call(monkeypatch, T=1024)
    assert kw["FULL"] is True


@pytest.mark.parametrize("layout", ["KV", "VK"])
def test_ws_host_side_checkpoints_pool_and_passes(layout, monkeypatch):
    vk = layout == "VK"
    ck = torch.zeros(5, 2, 128, 128)
    segs = torch.zeros(3, 6, dtype=torch.int32)
    common = dict(B=1, T=512, state_vk=vk, cu_seqlens=torch.tensor([0, 200, 512]),
                  chunk_offsets=torch.tensor([0, 13]), num_seqs=2,
                  state_indices=torch.tensor([1, -1]), checkpoints=ck,
                  checkpoint_offsets=torch.tensor([0, 3]), checkpoint_chunks=4)
    (grid, args, kw), = _ws_call(monkeypatch, **common)
    assert kw["IS_VARLEN"] and kw["HAS_IDX"] and kw["CKC"] == 4 and kw["FULL"] is False
    # the checkpoints as rows of [rows * H * V, K] (VK) or [rows * H * K, V] (KV)
    assert list(args[8].shape) == [5 * 2 * 128, 128]
    assert list(args[8].block_shape) == ([64, 128] if vk else [128, 64])
    calls = _ws_call(monkeypatch, **common, segments=segs, summary=torch.zeros(3, 2, 256, 128),
                     passes=(1, 2))
    assert [(c[0], c[2]["PASS"], c[2]["NV"]) for c in calls] == [((4, 6), 1, 4),
                                                                  ((2, 6), 2, 2)]


def test_ws_gives_way_past_the_grids_second_axis(monkeypatch):
    # more (sequence, head) items than CUDA's second grid axis holds: no Gluon launch, the
    # Triton kernel's two launches (its own flags) instead
    redo = []
    monkeypatch.setattr(ws, "_MAX_GRID_Y", 3)
    assert _ws_call(monkeypatch, B=2, T=64, H=2, redo=redo) == []
    (k,) = redo
    assert k["first_flags"] is None and k["guard"] == "launch"
    monkeypatch.setattr(ws, "_MAX_GRID_Y", 4)
    assert len(_ws_call(monkeypatch, B=2, T=64, H=2)) == 1


def test_ws_flagged_programs_go_to_the_triton_redo(monkeypatch):
    # a program whose state left fp16's range is redone by the Triton kernel's second launch
    # (FLAG 2: only the programs whose flag is set run) with the Gluon launch's flags, pass by
    # pass, launched whatever the flags: no host sync, so a CUDA graph can capture the call
    redo = []
    monkeypatch.setattr(torch.Tensor, "any", lambda *a, **k: pytest.fail("a host sync"))
    for flag in (0, 1):
        redo.clear()
        calls = _ws_call(monkeypatch, flag=flag, redo=redo)
        (k,) = redo
        assert k["first_flags"] is calls[0][1][13] and k["passes"] == (0,)
        assert int(k["first_flags"][0]) == flag
        assert (k["guard"], k["dot"], k["block_v"], k["num_warps"]) == ("launch", "fp16", 64, 4)
    redo.clear()
    segs = torch.zeros(3, 6, dtype=torch.int32)
    calls = _ws_call(monkeypatch, B=1, T=512, segments=segs, summary=torch.zeros(3, 2, 256, 128),
                     passes=(1, 2), cu_seqlens=torch.tensor([0, 200, 512]), redo=redo,
                     chunk_offsets=torch.tensor([0, 13]), num_seqs=2)
    assert [k["passes"] for k in redo] == [(1,), (2,)]
    assert [k["first_flags"] for k in redo] == [c[1][13] for c in calls]


def test_ws_applies_only_where_it_can():
    v, *ops = _ops(1, 32, 2, 64, 64)
    assert not ws.applies(v, ops, "fp16")  # on the CPU: no interpreter for Gluon
    with pytest.raises(ValueError, match="config.stage2"):
        KernelConfig(stage2="cuda")


def test_check_names_the_gluon_stage(monkeypatch):
    # `kdalab check kdalab-gluon` / `kdalab hunt kdalab-gluon`: the GPU only, even where the
    # interpreter runs the Triton kernels on the CPU; gradients through chunk_kda
    from kdalab.check.builtin import load_kernel

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    adapter = load_kernel("kdalab-gluon")
    assert adapter.name == "kdalab-gluon" and tuple(adapter.devices) == ("cuda",)
    assert not adapter.no_backward and adapter.decode is not None
    assert "cpu" in tuple(load_kernel("kdalab").devices)


# ---------------------------------------------------------------- GPU

def _same_bits(a, b):
    """(equal?, where they first part: index, 16-token chunk of dim 1, count) for messages."""
    if torch.equal(a, b):
        return True, None
    bad = (a.float() != b.float()).nonzero()
    first = [int(x) for x in bad[0]] if len(bad) else None
    return False, dict(first=first, chunk=first[1] // 16 if first and a.dim() > 1 else None,
                       differ=int(len(bad)), of=a.numel(),
                       max=float((a.float() - b.float()).abs().max()))


def _spy(monkeypatch):
    calls = []
    real = ws.chunk_kda_recurrent_ws

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(ws, "chunk_kda_recurrent_ws", counted)
    return calls


@gpu
@pytest.mark.parametrize("T,h0", [(16, False), (16, True), (32, True), (48, True), (64, True)])
def test_gpu_ws_few_chunks(T, h0, monkeypatch):
    # the smallest cases first (one chunk; the 3-deep ring filled, then wrapped): where the
    # Gluon kernel parts from the Triton kernel, if it does, shows here before the big shapes
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, T, 1, 128, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True,
                initial_state=_state(1, 1, 128, 128, seed=1, device="cuda") if h0 else None)
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args, config=GLUON)
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args, config=TRITON)
    assert calls
    for got, want in ((o, to), (s, ts)):
        same, where = _same_bits(got, want)
        assert same, where


@gpu
@pytest.mark.parametrize("family", ["model_like", "weak_decay_correlated"])
@pytest.mark.parametrize("K,layout,state_dtype", [(128, "KV", torch.float32),
                                                  (128, "VK", torch.bfloat16),
                                                  (64, "KV", None)])
def test_gpu_ws_has_the_triton_kernels_bits(family, K, layout, state_dtype, monkeypatch):
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs(family, 2, 1024, 4, K, device="cuda")
    h0 = None if state_dtype is None else _state(2, 4, K, K, seed=1, layout=layout,
                                                 dtype=state_dtype, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, initial_state=h0, output_final_state=True,
                state_layout=layout)
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args, config=GLUON)
    assert calls, "the Gluon kernel did not run"
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args, config=TRITON)
    for got, want in ((o, to), (s, ts)):
        same, where = _same_bits(got, want)
        assert same, where
    ro, rs = reference_forward(q, k, v, g, beta, **args)
    assert _err(o, ro) < TOL_BF16_GPU and _err(s, rs) < TOL_FP32


@gpu
@pytest.mark.parametrize("cu", [None, [0, 1300, 1847, 1847, 3895, 4858, 5129, 8192]])
def test_gpu_ws_varlen_and_ragged_lengths(cu, monkeypatch):
    # sequences that end inside a chunk (the TMA box reads the next one's rows: zeroed), an
    # empty one, and a fixed length that is not a multiple of 16
    calls = _spy(monkeypatch)
    T = 8192 if cu else 1000
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1 if cu else 2, T, 4, 128,
                                               device="cuda")
    n = len(cu) - 1 if cu else 2
    args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True,
                initial_state=_state(n, 4, 128, 128, seed=2, device="cuda"),
                cu_seqlens=None if cu is None else torch.tensor(cu, device="cuda"))
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args, config=GLUON)
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args, config=TRITON)
    assert calls and torch.equal(o, to) and torch.equal(s, ts)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["KV", "VK"])
def test_gpu_ws_pool_and_checkpoints(dtype, layout, monkeypatch):
    # serving: states as pool rows (one sequence without a row: a zero start, no final
    # state), checkpoints every 64 tokens stored by TMA as the chunks run
    calls = _spy(monkeypatch)
    cu = torch.tensor([0, 700, 2048, 2100, 4096], device="cuda")
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, 4096, 4, 128, device="cuda")
    pool = _state(6, 4, 128, 128, seed=3, layout=layout, dtype=dtype, device="cuda")
    idx = torch.tensor([4, -1, 0, 2], device="cuda", dtype=torch.int32)
    out = []
    for config in (GLUON, TRITON):
        p = pool.clone()
        o, _, ck = chunk_kda_fwd(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu,
                                 state_layout=layout, state_pool=p, state_indices=idx,
                                 checkpoint_every=64, config=config)
        out.append((o, p, ck))
    assert calls
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)


@gpu
@pytest.mark.parametrize("cu", [None, [0, 3000, 3000, 9001]])
def test_gpu_ws_sequence_parallel_passes(cu, monkeypatch):
    # the split plan (segments of 32 chunks): summaries (pass 1, the identity rows of M^T
    # without values), the combine, the segments from their start states (pass 2, the final
    # state from a sequence's last segment, checkpoints continuing the sequence's count)
    calls = _spy(monkeypatch)
    T = 9001 if cu else 4096
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, T, 2, 128, device="cuda")
    n = len(cu) - 1 if cu else 1
    args = dict(A_log=A_log, dt_bias=dt_bias, lower_bound=-0.1, output_final_state=True,
                initial_state=_state(n, 2, 128, 128, seed=4, device="cuda"),
                cu_seqlens=None if cu is None else torch.tensor(cu, device="cuda"))
    split = dict(dot="fp16", segment_chunks=32, block_v=64, num_warps=4)
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args,
                         config=KernelConfig(**split, stage2="gluon"))
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args,
                           config=KernelConfig(**split, fp16_guard="launch", stage2="triton"))
    assert len(calls) == 2 and torch.equal(o, to) and torch.equal(s, ts)
    # the fp64 reference refuses an empty sequence: it runs the others, and the empty one's
    # final state is its initial state
    keep = [i for i in range(n) if cu is None or cu[i + 1] > cu[i]]
    ref = dict(args, initial_state=args["initial_state"][keep])
    if cu is not None:
        ref["cu_seqlens"] = torch.unique(args["cu_seqlens"])
    ro, rs = reference_forward(q, k, v, g, beta, **ref)
    assert _err(o, ro) < TOL_BF16_GPU and _err(s[keep], rs) < TOL_FP32
    empty = [i for i in range(n) if i not in keep]
    assert torch.equal(s[empty], args["initial_state"][empty])


@gpu
def test_gpu_ws_long_sequence_and_many_heads(monkeypatch):
    # the grid's serial shape class (T 8192 H 64 runs 128 programs of 512 chunks): the ring's
    # phases over many chunks, many programs an SM
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, 4096, 32, 128, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args, config=GLUON)
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args, config=TRITON)
    assert calls and torch.equal(o, to) and torch.equal(s, ts)


@gpu
@pytest.mark.parametrize("P", [700, 1296])
def test_gpu_ws_fp16_guard_redo_is_bit_causal(P, monkeypatch):
    # values from token P on past fp16's range on one head: the Gluon pass flags that head's
    # programs and Triton's second launch redoes them; the outputs before P are those of the
    # same call without the large values, bit for bit, the other heads untouched, and the
    # whole equals the Triton kernel's guarded call
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, 2000 // 16 * 16, 4, 128,
                                               device="cuda")
    big = v.clone()
    big[:, P:, 2] *= 3e5
    h0 = torch.randn(1, 4, 128, 128, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, initial_state=h0, output_final_state=True)
    o, s = chunk_kda_fwd(q, k, big, g, beta, **args, config=GLUON)
    po, ps = chunk_kda_fwd(q, k, v, g, beta, **args, config=GLUON)
    to, ts = chunk_kda_fwd(q, k, big, g, beta, **args, config=TRITON)
    assert len(calls) == 2
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert torch.equal(o[:, :P], po[:, :P])
    keep = [0, 1, 3]
    assert torch.equal(o[:, :, keep], po[:, :, keep]) and torch.equal(s[:, keep], ps[:, keep])
    assert torch.equal(o, to) and torch.equal(s, ts)
    ro, rs = reference_forward(q, k, big, g, beta, **args)
    assert _err(o[:, :, 2], ro[:, :, 2]) < TOL_BF16_GPU and _err(s[:, 2], rs[:, 2]) < TOL_FP32


def test_auto_plans_triton_off_hopper():
    # stage2="auto" considers the Gluon kernel only with fp16 products on a Hopper GPU: on the
    # CPU (the interpreter), with tf32 products, or forced to Triton, the plan is Triton's
    from kdalab.kernels import api
    from kdalab.kernels.tables import fixed_sequences

    seqs = fixed_sequences(torch.device("cpu"), 1, 8192)
    for dot, config in (("fp16", KernelConfig()), ("tf32", KernelConfig()),
                        ("fp16", KernelConfig(stage2="triton"))):
        assert api._gluon(seqs, dot, config) == "no"


@gpu
def test_gpu_default_config_plans_gluon_and_keeps_tritons_bits(monkeypatch):
    # the default config at T 8192 H 64 (the grid's serial shape): the plan takes the Gluon
    # kernel (BV 64, serial), and its call equals the Triton kernel's on the same plan
    from kdalab.kernels import api
    from kdalab.kernels.tables import fixed_sequences

    seqs = fixed_sequences(torch.device("cuda"), 1, 8192)
    assert api._gluon(seqs, "fp16", KernelConfig()) == "yes"
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, 8192, 64, 128, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    o, s = chunk_kda_fwd(q, k, v, g, beta, **args)
    assert len(calls) == 1
    to, ts = chunk_kda_fwd(q, k, v, g, beta, **args, config=TRITON)
    assert len(calls) == 1 and torch.equal(o, to) and torch.equal(s, ts)


def _problem(B, T, H, K=128, V=128):
    from kdalab.kernels.contract import prefill_problem

    z = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)  # noqa: E731
    return prefill_problem(z(B, T, H, K), z(B, T, H, K), z(B, T, H, V), z(B, T, H, K),
                           z(B, T, H), scale=None, initial_state=None, A_log=None,
                           dt_bias=None, gate="raw", lower_bound=-5.0, cu_seqlens=None,
                           use_qk_l2norm=True, beta_is_logits=True, state_layout="KV",
                           config=KernelConfig())


@pytest.mark.parametrize("T,H,gluon", [(1024, 16, True), (4096, 16, False)])
def test_capture_plans_gluon_only_on_the_triton_plans_own_tile(T, H, gluon, monkeypatch):
    # under CUDA-graph capture (mocked on the CPU) the plan's Triton BV-64 pass becomes the
    # Gluon kernel (the same bits, no host time replayed); another tile (T 4096 H 16: BV 128,
    # segments) stays, and an eager call keeps the Triton plan
    from kdalab.kernels import api
    from kdalab.kernels.tables import fixed_sequences

    monkeypatch.setattr(api, "_gluon", lambda *a: "yes")
    p = _problem(1, T, H)
    seqs = fixed_sequences(torch.device("cpu"), 1, T)
    eager = api.plan_for(seqs, p, KernelConfig())
    monkeypatch.setattr(api, "_capturing", lambda seqs: True)
    captured = api.plan_for(seqs, p, KernelConfig())
    assert eager.stage2 == "triton"
    assert captured.stage2 == ("gluon" if gluon else "triton")
    assert (captured.block_v, captured.segment_chunks) == (eager.block_v, eager.segment_chunks)


@gpu
def test_gpu_captured_call_runs_gluon_with_the_eager_calls_bits(monkeypatch):
    # T 1024 H 16: eagerly the Triton pass (host-bound there), captured the Gluon kernel; the
    # replay's outputs are the eager call's bits (warm-up eagerly first, as a server does: the
    # Gluon kernel then compiles and loads during the capture)
    calls = _spy(monkeypatch)
    q, k, v, g, beta, A_log, dt_bias = _inputs("model_like", 1, 1024, 16, 128, device="cuda")
    args = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    eager = chunk_kda_fwd(q, k, v, g, beta, **args)
    assert not calls
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chunk_kda_fwd(q, k, v, g, beta, **args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, st = chunk_kda_fwd(q, k, v, g, beta, **args)
    assert calls, "the captured call did not take the Gluon kernel"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, eager[0]) and torch.equal(st, eager[1])

"""kernels/replay.py (``launch="replay"``, the entry points' default): a replayed call hands
every compiled kernel the arguments the direct path would — the same kernels, grids and
scalars, the new call's inputs at their addresses, and its own fresh buffers where the
direct path has its buffers (views of one allocation at the same offsets) — checked on the
CPU with Triton's compile and launcher stubbed (checkpoints too: their tensor descriptor
rebuilt on the new buffer, the rows past the last checkpoint zeroed); what cannot be
replayed is not (launch hooks), a changed key records again, and the records are capped.
On the GPU: the same bits as the direct path (prefill: fixed length, pool, varlen with GVA,
checkpoints, split, both guard forms; decode)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.jit import JITFunction  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from kdalab.kernels import KernelConfig, chunk_kda_fwd, kda_decode  # noqa: E402
from kdalab.kernels import launch as L  # noqa: E402
from kdalab.kernels import replay as R  # noqa: E402
from kdalab.kernels.chunk_combine import chunk_kda_combine_kernel  # noqa: E402
from kdalab.kernels.chunk_kda import _REPLAY as FWD_REPLAY  # noqa: E402
from kdalab.kernels.chunk_prepare import chunk_kda_prepare_kernel  # noqa: E402
from kdalab.kernels.chunk_recurrent import chunk_kda_recurrent_kernel  # noqa: E402
from kdalab.kernels.decode import _REPLAY as DEC_REPLAY  # noqa: E402
from kdalab.kernels.decode import kda_decode_kernel  # noqa: E402
from tests.serving_inputs import inputs, pool  # noqa: E402
from tests.test_launch import PLAN_BASES, _NoHooks  # noqa: E402

gpu = pytest.mark.gpu
KERNELS = (chunk_kda_prepare_kernel, chunk_kda_recurrent_kernel, chunk_kda_combine_kernel,
           kda_decode_kernel)


class _Hooked:
    launch_enter_hook, launch_exit_hook = print, None


@pytest.fixture
def stubbed(monkeypatch):
    """Triton's compile and every compiled kernel's launcher stubbed: each launch lands in
    the returned list as (compiled kernel, grid, values) — tensors where the direct path
    hands tensors, addresses where a replay does."""
    if not all(isinstance(k, JITFunction) for k in KERNELS):
        pytest.skip("the kernels are the interpreter's here (TRITON_INTERPRET=1 at import)")
    launched = []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        def __init__(self, name):
            self.name = name

        def run(self, g0, g1, g2, stream, function, meta, *rest):
            assert stream == "stream" and rest[:3] == (None, None, None)
            launched.append((self, (g0, g1, g2), list(rest[3:])))

    for kern in KERNELS:
        def compile_and_launch(*args, grid, warmup, kern=kern, **kwargs):
            c = Compiled(kern.__name__)
            # what kernel[grid] hands the launcher: the parameters in signature order
            names = [p.name for p in kern.params]
            values = list(args) + [kwargs[n] if n in kwargs else p.default
                                   for n, p in zip(names[len(args):], kern.params[len(args):])]
            launched.append((c, tuple(grid) + (1,) * (3 - len(grid)), values))
            return c
        monkeypatch.setattr(kern, "run", compile_and_launch)
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: "stream", _NoHooks])
    monkeypatch.setattr(L, "_TABLES", {})
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the entry points' CPU check (kernels stay JIT)
    FWD_REPLAY.records.clear()
    DEC_REPLAY.records.clear()
    yield launched
    FWD_REPLAY.records.clear()
    DEC_REPLAY.records.clear()


def _same_launches(replayed, direct, inputs):
    """``replayed`` (addresses) hands the launcher what ``direct`` (tensors) does: the same
    compiled kernels, grids and scalars; an input's address where direct has that input;
    elsewhere one fresh address per direct buffer, at the same offsets."""
    assert len(replayed) == len(direct) > 0
    addresses = {x.data_ptr() for x in inputs if x is not None}
    shift = {}
    for (k1, g1, v1), (k2, g2, v2) in zip(replayed, direct, strict=True):
        assert k1 is k2 and g1 == g2 and len(v1) == len(v2)
        for a, b in zip(v1, v2):
            if isinstance(b, TensorDescriptor):  # the checkpoints: rebuilt on a new buffer
                assert isinstance(a, TensorDescriptor) and a.base.dtype == b.base.dtype
                assert [list(a.shape), list(a.strides), list(a.block_shape), a.padding] == [
                    list(b.shape), list(b.strides), list(b.block_shape), b.padding]
                base, moved = b.base.untyped_storage().data_ptr(), a.base.data_ptr()
                assert b.base.data_ptr() == base  # a whole buffer
                assert shift.setdefault(base, moved - base) == moved - base
                continue
            if not isinstance(b, torch.Tensor):
                assert a == b
                continue
            assert isinstance(a, int)
            if b.data_ptr() in addresses:
                assert a == b.data_ptr()
            else:
                base = b.untyped_storage().data_ptr()
                assert shift.setdefault(base, a - b.data_ptr()) == a - b.data_ptr()
    moved = [b + s for b, s in shift.items()]
    assert len(set(moved)) == len(moved)  # distinct buffers stay distinct
    assert not set(moved) & addresses  # and none of them is an input


def _fresh(*xs):
    return [None if x is None else x.clone() for x in xs]


def _calls(stubbed, run, make):
    """Record (first replay-mode call), replay on new inputs, and the direct path on those:
    returns (replayed launches, direct launches, the new inputs, replayed and direct
    results)."""
    run(make(), "replay")  # recorded
    stubbed.clear()
    new = make()
    out = run(new, "replay")
    replayed = list(stubbed)
    stubbed.clear()
    ref = run(new, "direct")
    return replayed, list(stubbed), new, out, ref


FWD_CASES = {
    "fixed": dict(),
    "state": dict(state=True),
    "pool": dict(pool=True),
    "varlen_gva": dict(varlen=True, HV=4),
    "split": dict(config=KernelConfig(segment_chunks=2), state=True),
    "guard_launch": dict(config=KernelConfig(fp16_guard="launch", block_v=128, num_warps=8)),
    # checkpoints (a tensor descriptor); varlen: 3 of the 4 rows written, the last zeroed
    "pool_checkpoints": dict(pool=True, checkpoint_every=32),
    "varlen_checkpoints": dict(varlen=True, HV=4, pool=True, checkpoint_every=16),
    "split_checkpoints": dict(config=KernelConfig(segment_chunks=2), pool=True,
                              checkpoint_every=16),
}


@pytest.mark.parametrize("case", FWD_CASES, ids=list(FWD_CASES))
def test_prefill_replay_hands_the_launcher_what_the_direct_path_does(stubbed, case,
                                                                     monkeypatch):
    c = FWD_CASES[case]
    # buffers come back dirty (as the CUDA allocator's may): a row left unzeroed shows
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(7))
    HV = c.get("HV", 2)
    base = c.get("config", KernelConfig())
    cu = torch.tensor([0, 20, 20, 64], dtype=torch.int32) if c.get("varlen") else None
    seed = iter(range(100))

    def make():
        s = next(seed)
        q, k, v, g, beta, kw = inputs(1 if cu is not None else 2, 64, 2, HV, 32, 32, seed=s)
        n = 3 if cu is not None else 2
        extra = {}
        if c.get("state"):
            extra = dict(initial_state=pool(n, HV, 32, 32, seed=s), output_final_state=True)
        if c.get("pool"):
            extra = dict(state_pool=pool(5, HV, 32, 32, seed=s),
                         state_indices=torch.tensor([4, 1, 2][:n]))
        if c.get("checkpoint_every"):
            extra["checkpoint_every"] = c["checkpoint_every"]
        return (q, k, v, g, beta), dict(kw, cu_seqlens=cu, **extra)

    def run(x, how):
        args, kw = x
        return chunk_kda_fwd(*args, config=dataclasses.replace(base, launch=how), **kw)

    replayed, direct, (args, kw), out, ref = _calls(stubbed, run, make)
    ins = [*args, kw.get("initial_state"), kw["A_log"], kw["dt_bias"], kw.get("state_pool"),
           kw.get("state_indices"), cu]
    _same_launches(replayed, direct, ins)
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype and a.data_ptr() != b.data_ptr()
    if c.get("checkpoint_every"):
        assert any(r is not R._NO for r in FWD_REPLAY.records.values())  # replayed
        if cu is not None:  # rows past the last checkpoint: zeroed on each replay too
            (rec,) = FWD_REPLAY.records.values()
            assert [z for _, z in rec.zero_rows] == [3]
            assert not out[2][3:].any() and not ref[2][3:].any() and (out[2][:3] == 7).all()


@pytest.mark.parametrize("with_out", [False, True])
def test_decode_replay_hands_the_launcher_what_the_direct_path_does(stubbed, with_out):
    seed = iter(range(100))

    def make():
        s = next(seed)
        q, k, v, g, beta, kw = inputs(3, 1, 2, 4, 32, 32, seed=s)
        kw.update(state_pool=pool(6, 4, 32, 32, seed=s), state_indices=torch.tensor([5, 0, 2]))
        if with_out:
            kw["out"] = torch.empty_like(v)
        return (q, k, v, g, beta), kw

    def run(x, how):
        args, kw = x
        return kda_decode(*args, launch=how, **kw)

    replayed, direct, (args, kw), out, ref = _calls(stubbed, run, make)
    _same_launches(replayed, direct, [*args, kw["state_pool"], kw["state_indices"],
                                      kw["A_log"], kw["dt_bias"], kw.get("out")])
    if with_out:
        assert out is kw["out"]
    else:
        assert out.shape == ref.shape and out.data_ptr() != ref.data_ptr()


def test_what_is_not_replayed_and_what_records_again(stubbed, monkeypatch):
    q, k, v, g, beta, kw = inputs(2, 64, 2, 2, 32, 32)
    replay = KernelConfig(launch="replay")

    def addresses_only():
        return all(not isinstance(x, torch.Tensor) for _, _, vs in stubbed for x in vs)

    # a key seen: replayed; with launch hooks set (a profiler): the ordinary path
    chunk_kda_fwd(q, k, v, g, beta, config=replay, **kw)
    stubbed.clear()
    chunk_kda_fwd(q, k, v, g, beta, config=replay, **kw)
    assert addresses_only()
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: "stream", _Hooked])
    stubbed.clear()
    chunk_kda_fwd(q, k, v, g, beta, config=replay, **kw)
    assert stubbed and not addresses_only()
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: "stream", _NoHooks])
    # another key: a misaligned input, another lower bound, a cu_seqlens changed in place
    n = len(FWD_REPLAY.records)
    buf = torch.empty(q.numel() + 1)
    shifted = buf[1:].view(q.shape).copy_(q)
    chunk_kda_fwd(shifted, k, v, g, beta, config=replay, **kw)
    chunk_kda_fwd(q, k, v, g, beta, config=replay, **dict(kw, lower_bound=-2.0))
    assert len(FWD_REPLAY.records) == n + 2
    flat = [x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, g, beta)]
    cu = torch.tensor([0, 64, 128], dtype=torch.int32)
    chunk_kda_fwd(*flat, cu_seqlens=cu, config=replay, **kw)
    cu[1] = 32
    stubbed.clear()
    chunk_kda_fwd(*flat, cu_seqlens=cu, config=replay, **kw)
    assert len(FWD_REPLAY.records) == n + 4 and not addresses_only()
    # q passed as k too: another key than distinct q and k of the same shapes
    chunk_kda_fwd(q, q, v, g, beta, config=replay, **kw)
    assert len(FWD_REPLAY.records) == n + 5
    # bad input still gets the ordinary path's ValueError, and records nothing
    with pytest.raises(ValueError, match="lower_bound"):
        chunk_kda_fwd(q, k, v, g, beta, config=replay, **dict(kw, lower_bound=3.0))
    assert len(FWD_REPLAY.records) == n + 5


def test_records_are_capped_and_release_what_they_kept(stubbed, monkeypatch):
    # a server may pass a new cu_seqlens tensor every call: each is a new key, recorded; past
    # CACHE_SIZE the least recently used record goes, and with it the tensors it kept alive
    import gc
    import weakref

    monkeypatch.setattr(R, "CACHE_SIZE", 3)
    q, k, v, g, beta, kw = inputs(1, 128, 2, 2, 32, 32)
    first = None
    for n in range(5):
        cu = torch.tensor([0, 16 * (n + 1), 128], dtype=torch.int32)
        if first is None:
            first = weakref.ref(cu)
        chunk_kda_fwd(q, k, v, g, beta, cu_seqlens=cu, **kw)
        assert len(FWD_REPLAY.records) == min(n + 1, 3)
    del cu
    gc.collect()
    assert first() is None  # the first call's cu_seqlens, dropped with its record
    # a kept key still replays (addresses), the most recent one
    stubbed.clear()
    last = torch.tensor([0, 80, 128], dtype=torch.int32)
    chunk_kda_fwd(q, k, v, g, beta, cu_seqlens=last, **kw)
    stubbed.clear()
    chunk_kda_fwd(q, k, v, g, beta, cu_seqlens=last, **kw)
    assert stubbed and all(not isinstance(x, torch.Tensor) for _, _, vs in stubbed for x in vs)


def test_replay_option_is_accepted():
    assert KernelConfig(launch="replay").launch == "replay"
    assert R.tensors_key([None, torch.zeros(2), torch.zeros(2)])[1] == (0, 1, 2)


# ------------------------------------------------------------ GPU

@gpu
@pytest.mark.parametrize("base", PLAN_BASES.values(), ids=PLAN_BASES.keys())
def test_gpu_prefill_replay_same_bits(base):
    """Replayed calls (the second and third of a key, on new inputs) give the direct path's
    bits: fixed length through a pool, and varlen with GVA through a pool with checkpoints."""
    dev = "cuda"
    replay = dataclasses.replace(base, launch="replay")
    direct = dataclasses.replace(base, launch="direct")
    cu = torch.tensor([0, 17, 200, 512], device=dev, dtype=torch.int32)
    for seed in (3, 4, 5):
        q, k, v, g, beta, kw = inputs(2, 256, 2, 4, 128, 128, seed=seed, device=dev,
                                      dtype=torch.bfloat16)
        p = pool(5, 4, 128, 128, device=dev, seed=seed)
        idx = torch.tensor([3, 0], device=dev)
        runs = []
        for cfg in (replay, direct):
            pp = p.clone()
            o, _ = chunk_kda_fwd(q, k, v, g, beta, state_pool=pp, state_indices=idx,
                                 config=cfg, **kw)
            runs.append((o, pp))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
        flat = [x.reshape(1, -1, *x.shape[2:])[:, :512] for x in (q, k, v, g, beta)]
        h0 = pool(3, 4, 128, 128, device=dev, seed=seed)
        kw2 = dict(kw, cu_seqlens=cu, state_pool=h0.clone(), state_indices=idx.new_tensor(
            [2, 0, 1]), checkpoint_every=64)
        # checkpoints: 0 + 2 + 4 of the 8 rows, the last 2 zeroed (the replay zeroes them too)
        pools = [kw2["state_pool"], kw2["state_pool"].clone()]
        a = chunk_kda_fwd(*flat, config=replay, **kw2)
        b = chunk_kda_fwd(*flat, config=direct, **dict(kw2, state_pool=pools[1]))
        assert a[2].shape[0] == 8 and not a[2][6:].any()
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
        assert torch.equal(pools[0], pools[1])
    assert any(r is not R._NO for r in FWD_REPLAY.records.values())  # something replayed


@gpu
def test_gpu_decode_replay_same_bits():
    dev = "cuda"
    for seed in (4, 5, 6):
        q, k, v, g, beta, kw = inputs(3, 2, 2, 4, 128, 128, seed=seed, device=dev,
                                      dtype=torch.bfloat16)
        p = pool(6, 4, 128, 128, device=dev, seed=seed)
        idx = torch.tensor([5, 1, 2], device=dev)
        outs = []
        for how in ("replay", "direct"):
            pp = p.clone()
            outs.append((kda_decode(q, k, v, g, beta, state_pool=pp, state_indices=idx,
                                    launch=how, **kw), pp))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert any(r is not R._NO for r in DEC_REPLAY.records.values())

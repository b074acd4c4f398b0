"""kernels/launch.py: the key it builds from what Triton specializes on (CPU), its fallback to
``kernel[grid]`` (CPU), and on the GPU the direct launches against Triton's own: the same
bits for prefill (serial, split, pool, checkpoints, GVA) and decode, misaligned pointers
and integers of 1 taking other compiled kernels rather than the first one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from kdalab.kernels import KernelConfig, chunk_kda_fwd, kda_decode  # noqa: E402
from kdalab.kernels import launch as L  # noqa: E402
from tests.serving_inputs import inputs, pool  # noqa: E402

gpu = pytest.mark.gpu


def test_spec_keys_what_triton_specializes():
    x = torch.zeros(64, dtype=torch.float16)
    assert L._spec(x) == (torch.float16, True)
    assert L._spec(x[1:]) == (torch.float16, False)  # 2 bytes past a 16-byte address
    assert L._spec(x[8:]) == (torch.float16, True)
    assert L._spec(x.float()) == (torch.float32, True)
    # integers: width, == 1, multiple of 16
    assert L._spec(1) == (0, True, False)
    assert L._spec(16) == (0, False, True)
    assert L._spec(17) == (0, False, False)
    assert L._spec(2**31) == (1, False, True) and L._spec(-2**31) == (0, False, True)
    assert L._spec(2**63) == (2, False, True)
    assert len({L._spec(v) for v in (1, 2, 16, 32, 2**31)}) == 4  # 16 and 32 alike
    assert L._spec(None) is None and L._spec(True) is bool and L._spec(0.5) is float
    with pytest.raises(L._Unkeyed):
        L._spec("a string")
    # a tensor descriptor (the checkpoints' store): its base's dtype and its block, rank,
    # padding and tf32 flag; not its address, shape or strides (Triton's type string has
    # no alignment key: native_specialize_impl gives ('tensordesc<fp32[1, 8, 16]>', None))
    from triton.tools.tensor_descriptor import TensorDescriptor

    ck = torch.zeros(6, 8, 16)
    desc = TensorDescriptor.from_tensor
    assert L._spec(desc(ck, [1, 8, 16])) == L._spec(desc(ck[2:], [1, 8, 16]))
    assert L._spec(desc(ck, [1, 8, 16])) == L._spec(desc(torch.zeros(9, 8, 16), [1, 8, 16]))
    assert len({L._spec(d) for d in (desc(ck, [1, 8, 16]), desc(ck, [1, 8, 8]),
                                      desc(ck.bfloat16(), [1, 8, 16]),
                                      desc(ck.view(48, 16), [8, 16]),
                                      desc(ck, [1, 8, 16], padding="nan"))}) == 5


class _Recorder:
    """Stands in for a kernel that is not a JITFunction (the interpreter's)."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *a, **kw: self.calls.append((grid, a, kw))


def test_launch_falls_back_to_kernel_grid():
    fn = _Recorder()
    for direct in (True, False):
        L.launch(fn, (3, 2), (1, None), dict(BLOCK=4, num_warps=2), direct=direct)
    assert fn.calls == [((3, 2), (1, None), dict(BLOCK=4, num_warps=2))] * 2


def test_launch_table_hands_the_launcher_every_parameter_in_order(monkeypatch):
    """The direct path's argument list on the CPU, with Triton's compile and the launcher
    stubbed: every parameter in signature order (positional, keyword, default, constexpr),
    the grid padded to three, the current stream; a new specialization (a misaligned
    pointer, an int of 1) or another constexpr goes through ``kernel[grid]`` again; the
    table keeps no tensor of the call that filled it."""
    import triton
    import triton.language as tl

    @triton.jit
    def kern(x_ptr, n, y_ptr, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = 3):
        pass

    launched, compiled = [], []

    class Compiled:
        function, packed_metadata = "fn", "meta"

        @staticmethod
        def run(*a):
            launched.append(a)

    def compile_and_launch(*args, grid, warmup, **kwargs):
        compiled.append((grid, args, kwargs))
        return Compiled()

    monkeypatch.setattr(kern, "run", compile_and_launch)
    monkeypatch.setattr(L, "_DRIVER", [lambda: 0, lambda device: "stream", _NoHooks])
    x, y = torch.zeros(64), torch.zeros(64)
    call = lambda x, n, BLOCK=128: L.launch(kern, (5,), (x, n),  # noqa: E731
                                            dict(y_ptr=y, scale=0.5, BLOCK=BLOCK, num_warps=2))
    call(x, 100)
    assert len(compiled) == 1 and not launched
    flat = lambda xs: [y for x in xs for y in (flat(x) if isinstance(x, tuple) else [x])]  # noqa: E731
    assert not any(isinstance(v, torch.Tensor) for v in flat(tuple(L._TABLES[kern][-1])))
    call(x, 200)
    assert len(compiled) == 1
    assert launched == [(5, 1, 1, "stream", "fn", "meta", None, None, None,
                         x, 200, y, 0.5, 128, 3)]
    for other in ((x[1:], 100), (x, 1), (x, 100, 64)):
        call(*other)
    assert len(compiled) == 4 and len(launched) == 1
    call(x[4:], 100)  # 16 bytes on: aligned, as the first call
    assert len(compiled) == 4 and launched[-1][9].data_ptr() == x[4:].data_ptr()


class _NoHooks:
    launch_enter_hook = launch_exit_hook = None


def test_hooks_are_seen_in_either_form():
    from triton.knobs import HookChain

    chain = HookChain()
    assert not L._hooked(None) and not L._hooked(chain)
    chain.add(print)
    assert L._hooked(chain) and L._hooked(print)


def test_launch_option_is_checked():
    with pytest.raises(ValueError, match="config.launch"):
        KernelConfig(launch="fast")
    assert KernelConfig().launch == "replay"  # the default (docs/kernels.md "Host overhead")
    with pytest.raises(ValueError, match="config.launch"):
        KernelConfig(launch="pointers")  # pruned (docs/kernels.md "Pruned")
    with pytest.raises(ValueError, match="config.launch"):
        KernelConfig(launch=["direct"])


# ------------------------------------------------------------ GPU

def _copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n) * scale, mask=o < n)

    return copy


@gpu
def test_gpu_launch_table_and_specializations():
    """The second call of a specialization goes through the table; a misaligned pointer, an
    n of 1 and another constexpr each get their own compiled kernel, and every result is
    right (a kernel compiled for 16-byte-aligned pointers would fault on a misaligned one)."""
    copy = _copy_kernel()
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    y = torch.zeros(1000, device="cuda")
    table = lambda: L._TABLES[copy][-1]  # noqa: E731
    L.launch(copy, (8,), (x, y, 1000, 2.0), dict(BLOCK=128))
    assert len(table()) == 1
    L.launch(copy, (8,), (x, y, 1000, 3.0), dict(BLOCK=128))
    assert len(table()) == 1 and torch.equal(y, x * 3)
    for xs, ys, n in ((x[1:], y[1:], 999), (x, y, 1), (x[3:], y[5:], 1)):
        y.zero_()
        L.launch(copy, (8,), (xs, ys, n, 2.0), dict(BLOCK=128))
        want = torch.zeros_like(y)
        want[y.numel() - ys.numel():][:n] = xs[:n] * 2
        torch.cuda.synchronize()
        assert torch.equal(y, want), (n, xs.storage_offset(), ys.storage_offset())
    L.launch(copy, (4,), (x, y, 1000, 1.0), dict(BLOCK=256))
    assert torch.equal(y, x)
    assert len(table()) == 5  # aligned; misaligned; n == 1; n == 1 misaligned; BLOCK 256


def _prefill_runs(q, k, v, g, beta, kw, base):
    return [chunk_kda_fwd(q, k, v, g, beta, config=dataclasses.replace(base, launch=how), **kw)
            for how in ("replay", "triton", "direct", "replay")]


#: the plans the GPU launch-form tests run under (test_replay.py too)
PLAN_BASES = {"plan": KernelConfig(), "split": KernelConfig(segment_chunks=4),
              "guard-launch": KernelConfig(fp16_guard="launch"),
              "bv128-inline": KernelConfig(fp16_guard="inline", block_v=128, num_warps=8)}


@gpu
@pytest.mark.parametrize("base", PLAN_BASES.values(), ids=PLAN_BASES.keys())
def test_gpu_prefill_direct_launch_same_bits(base):
    """Replayed launches (the default: recorded, then replayed), direct launches (from the
    table) and Triton's give the same bits:
    fixed length with a pool and checkpoints, varlen with GVA, and (with the plan's
    choices) inputs whose pointers are not 16-byte aligned after aligned ones of the same
    shapes."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(2, 256, 2, 4, 128, 128, seed=3, device=dev,
                                  dtype=torch.bfloat16)
    p = pool(5, 4, 128, 128, device=dev)
    idx = torch.tensor([3, 0], device=dev)
    runs = []
    for how in ("replay", "triton", "direct", "replay"):
        pp = p.clone()
        out = chunk_kda_fwd(q, k, v, g, beta, state_pool=pp, state_indices=idx,
                            checkpoint_every=64,
                            config=dataclasses.replace(base, launch=how), **kw)
        runs.append(out + (pp,))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other) if a is not None)
    from kdalab.kernels.chunk_prepare import chunk_kda_prepare_kernel
    assert L._TABLES[chunk_kda_prepare_kernel][-1]  # the direct path was taken
    # varlen (B = 1), GVA, an initial state; then the same inputs one element off alignment
    cu = torch.tensor([0, 17, 200, 512], device=dev, dtype=torch.int32)
    flat = [x.reshape(1, -1, *x.shape[2:])[:, :512] for x in (q, k, v, g, beta)]
    h0 = pool(3, 4, 128, 128, device=dev)
    kw2 = dict(kw, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    runs = _prefill_runs(*flat, kw2, base)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    if base != KernelConfig():
        return  # misaligned inputs once: each compiles every kernel again (the suite's time)
    shifted = []
    for x in flat:
        buf = torch.empty(x.numel() + 1, device=dev, dtype=x.dtype)
        s = buf[1:].view(x.shape)
        s.copy_(x)
        assert s.data_ptr() % 16 != 0
        shifted.append(s)
    runs = _prefill_runs(*shifted, kw2, base)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@gpu
def test_gpu_decode_direct_launch_same_bits():
    """kda_decode replayed, through the table and through kernel[grid]: the
    same outputs and pool."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(3, 2, 2, 4, 128, 128, seed=4, device=dev,
                                  dtype=torch.bfloat16)
    p = pool(6, 4, 128, 128, device=dev)
    idx = torch.tensor([5, 1, 2], device=dev)
    outs = []
    for how in ("replay", "triton", "direct", "replay"):
        pp = p.clone()
        o = kda_decode(q, k, v, g, beta, state_pool=pp, state_indices=idx, launch=how, **kw)
        outs.append((o, pp))
    for o, pp in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(pp, outs[0][1])
    from kdalab.kernels.decode import kda_decode_kernel
    assert L._TABLES[kda_decode_kernel][-1]  # the direct path was taken
    with pytest.raises(ValueError, match="launch"):
        kda_decode(q, k, v, g, beta, state_pool=p, state_indices=idx, launch="fast", **kw)

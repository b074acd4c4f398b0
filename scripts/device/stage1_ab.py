"""Stage 1 A/B in one process: the committed kernel (kernels/chunk_prepare.py) against the
previous one (a copy at kernels/_stage1_old.py, placed there for the call and not committed),
at the grid shapes where stage 1 is most of the time; 2 and 4 warps; then the whole forward."""

import sys

import torch
import triton

sys.path.insert(0, "benchmarks")
from bench_kernel import SHAPES, bench, make_inputs, run_kdalab  # noqa: E402

from kdalab.kernels import KernelConfig  # noqa: E402
from kdalab.kernels import _stage1_old as old  # noqa: E402
from kdalab.kernels import chunk_kda as ck  # noqa: E402
from kdalab.kernels import chunk_prepare as new  # noqa: E402

print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}")
for name in sys.argv[1].split(","):
    x = make_inputs(SHAPES[name])
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    seqs = ck._sequences(x["cu"], q.device, B, T)
    kw = dict(scale=K ** -0.5, lower_bound=-5.0, use_qk_l2norm=True, beta_is_logits=True,
              cu_seqlens=seqs.cu32, chunk_table=seqs.chunk_table, num_chunks=seqs.num_chunks,
              operand_dtype=torch.float16)
    args = (q, k, g, beta, x["A_log"], x["dt_bias"].reshape(H * K))
    ref = old.chunk_kda_prepare(*args, **kw, num_warps=2)
    ms = {}
    for nw in (2, 4):
        out = new.chunk_kda_prepare(*args, **kw, num_warps=nw)
        same = all(torch.equal(a, b) for a, b in zip(ref, out))
        ms[f"old_w{nw}"] = bench(lambda nw=nw: old.chunk_kda_prepare(*args, **kw, num_warps=nw))
        ms[f"new_w{nw}"] = bench(lambda nw=nw: new.chunk_kda_prepare(*args, **kw, num_warps=nw))
        ms[f"new_w{nw}_bits_equal"] = same
    fwd = {c: bench(lambda c=c: run_kdalab(x, KernelConfig(prepare_warps=c))) for c in (2, 4)}
    print(f"{name:20s} stage 1 ms: " + " ".join(
        f"{a}={b:.3f}" if isinstance(b, float) else f"{a}={b}" for a, b in ms.items())
        + f"  new/old(w2)={ms['new_w2'] / ms['old_w2']:.3f}  forward w2={fwd[2]:.3f} "
        f"w4={fwd[4]:.3f}", flush=True)

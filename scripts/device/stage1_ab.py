"""Stage 1 A/B in one process, at the grid shapes where stage 1 is most of the time.

    python scripts/device/stage1_ab.py SHAPES            (session 5, call 3)
        the committed kernel (kernels/chunk_prepare.py) against the previous one, a copy
        placed at kernels/_stage1_old.py for the call (not committed); 2 and 4 warps; then the
        whole forward
    python scripts/device/stage1_ab.py SHAPES --max-registers 168,192   (call 5)
        the committed kernel under ptxas register caps (more programs an SM) against none
Prints median ms (do_bench) and whether every output is equal, bit for bit, to the first."""

import argparse
import sys

import torch
import triton

sys.path.insert(0, "benchmarks")
from bench_kernel import SHAPES, bench, make_inputs, run_kdalab  # noqa: E402

from kdalab.kernels import KernelConfig  # noqa: E402
from kdalab.kernels import chunk_kda as ck  # noqa: E402
from kdalab.kernels import chunk_prepare as new  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("shapes")
ap.add_argument("--max-registers", default=None)
args = ap.parse_args()
print(f"triton {triton.__version__}, {torch.cuda.get_device_name()}")
if args.max_registers:
    variants = {"none": (new, None)}
    variants.update({f"cap{r}": (new, int(r)) for r in args.max_registers.split(",")})
else:
    from kdalab.kernels import _stage1_old as old
    variants = {"old": (old, None), "new": (new, None)}
for name in args.shapes.split(","):
    x = make_inputs(SHAPES[name])
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    seqs = ck._sequences(x["cu"], q.device, B, T)
    kw = dict(scale=K ** -0.5, lower_bound=-5.0, use_qk_l2norm=True, beta_is_logits=True,
              cu_seqlens=seqs.cu32, chunk_table=seqs.chunk_table, num_chunks=seqs.num_chunks,
              operand_dtype=torch.float16)
    inputs = (q, k, g, beta, x["A_log"], x["dt_bias"].reshape(H * K))
    ms, ref = {}, None
    for nw in (2, 4) if not args.max_registers else (2,):
        for vname, (mod, cap) in variants.items():
            extra = {"max_registers": cap} if cap else {}

            def call(mod=mod, nw=nw, extra=extra):
                return mod.chunk_kda_prepare(*inputs, **kw, num_warps=nw, **extra)
            out = call()
            ref = ref if ref is not None else out
            same = all(torch.equal(a, b) for a, b in zip(ref, out))
            ms[f"{vname}_w{nw}"] = bench(call)
            ms[f"{vname}_w{nw}_bits_equal"] = same
    cells = " ".join(f"{a}={b:.3f}" if isinstance(b, float) else f"{a}={b}"
                     for a, b in ms.items())
    if not args.max_registers:
        fwd = {c: bench(lambda c=c: run_kdalab(x, KernelConfig(prepare_warps=c))) for c in (2, 4)}
        cells += f"  forward w2={fwd[2]:.3f} w4={fwd[4]:.3f}"
    print(f"{name:20s} stage 1 ms: {cells}", flush=True)

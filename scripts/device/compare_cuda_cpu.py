"""On the H200: the seed experiment's fp16 arithmetic on CUDA (the GPU's own Tensor Cores,
``gpu-h200`` / ``gpu-h200-sgemm``) against kdalab's CPU emulation (``h200`` / ``h200-sgemm``),
bit for bit, on the 48 runs of the seed's tables; then the whole pipeline's records on both.

    PYTHONPATH=src python3 scripts/device/compare_cuda_cpu.py OUTDIR
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch

from kdalab.arith import FP16, get_accumulation, torch_cast
from kdalab.experiments.draw import make_inputs
from kdalab.experiments.inverse import METRIC_KEYS
from kdalab.experiments.sweep import run_sweep, seed_reproduction_runs
from kdalab.kda.intra import kernel_l, stable_l
from kdalab.kda.inverse import neumann_inverse
from kdalab.kda.recipe import SEED


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per run (leading dim): every fp16 entry has the same bits (any NaN equals any NaN)."""
    a, b = a.cpu(), b.cpu()
    same = (a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())
    return same.flatten(1).all(1)


def main(out: str) -> None:
    runs = seed_reproduction_runs()
    groups: dict[int, list] = {}
    for r in runs:
        groups.setdefault(r.chunk, []).append(r)
    tally = {"runs": 0, "L": 0, "kernel_inverse": 0, "stable_inverse": 0}
    for chunk, specs in sorted(groups.items()):
        inp = [make_inputs(s.family, s.chunk, s.dim, s.seed, s.lower_bound or -5.0) for s in specs]
        keys = torch.stack([i.keys for i in inp])
        g = torch.stack([i.log_decay for i in inp])
        beta = torch.stack([i.beta for i in inp])
        l_cpu = kernel_l(keys, g, beta, SEED.with_(l_accumulation="h200-sgemm")).l
        l_gpu = kernel_l(keys.cuda(), g.cuda(), beta.cuda(),
                         SEED.with_(l_accumulation="gpu-h200-sgemm")).l
        stable16 = torch_cast(stable_l(keys, g, beta), FP16).half()
        inv_cpu = neumann_inverse(l_cpu, get_accumulation("h200"), FP16).inverse
        inv_gpu = neumann_inverse(l_gpu, get_accumulation("gpu-h200"), FP16).inverse
        st_cpu = neumann_inverse(stable16, get_accumulation("h200"), FP16).inverse
        st_gpu = neumann_inverse(stable16.cuda(), get_accumulation("gpu-h200"), FP16).inverse
        tally["runs"] += len(specs)
        tally["L"] += int(bits_equal(l_cpu, l_gpu).sum())
        tally["kernel_inverse"] += int(bits_equal(inv_cpu, inv_gpu).sum())
        tally["stable_inverse"] += int(bits_equal(st_cpu, st_gpu).sum())
    print("bit-identical fp16 tensors, CUDA vs CPU emulation:", json.dumps(tally), flush=True)

    t0 = time.perf_counter()
    cpu = run_sweep(runs, ["h200"], device="cpu")
    t1 = time.perf_counter()
    gpu = run_sweep(runs, ["h200"], device="cuda")
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    worst: dict[str, float] = {}
    exact: dict[str, int] = {}
    for a, b in zip(cpu, gpu):
        for k in METRIC_KEYS:
            x, y = float(a[k]), float(b[k])
            same = x == y or (math.isnan(x) and math.isnan(y))
            exact[k] = exact.get(k, 0) + int(same)
            if not same and math.isfinite(x) and math.isfinite(y):
                worst[k] = max(worst.get(k, 0.0), abs(x - y) / max(abs(x), 1e-300))
    summary = {"records": len(cpu), "cpu_s": t1 - t0, "cuda_s": t2 - t1,
               "exactly_equal_per_metric": exact, "worst_relative_difference": worst}
    print(json.dumps(summary, indent=1))
    with open(f"{out}/compare_cuda_cpu.json", "w") as fh:
        json.dump({"tally": tally, **summary}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")

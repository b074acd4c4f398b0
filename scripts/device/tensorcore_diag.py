#!/usr/bin/env python3
"""Why does kdalab's run_group on CUDA give other L bits than on the CPU? (device diagnostic)

    PYTHONPATH=$PWD/src python3 scripts/device/tensorcore_diag.py $OUT

Compares, CUDA against CPU on the same inputs: torch.ldexp's exactness, kdalab's round_to to fp16,
bf16 and fp32, exp2_f32, and each stage of kernel_l (scales, scaled operands, L).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from kdalab.arith import BF16, FP16, FP32, round_to  # noqa: E402
from kdalab.arith.exp2 import exp2_f32  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
res = {}
rng = np.random.default_rng(5)
x = torch.tensor(rng.standard_normal(1 << 20) * np.exp2(rng.integers(-30, 30, 1 << 20)))
n = torch.tensor(rng.integers(-60, 60, 1 << 20), dtype=torch.float64)
exact = x * torch.tensor(np.exp2(n.numpy()))  # numpy: exact powers of two, exact products
res["ldexp_cuda_inexact"] = int((torch.ldexp(x.cuda(), n.cuda()).cpu() != exact).sum())
res["ldexp_cpu_inexact"] = int((torch.ldexp(x, n) != exact).sum())
for fmt in (FP16, BF16, FP32):
    a = round_to(x, fmt)
    b = round_to(x.cuda(), fmt).cpu()
    res[f"round_to_{fmt.name}_cuda_vs_cpu"] = int((a != b).sum())
y = torch.tensor(rng.uniform(-80, 80, 1 << 20))
res["exp2_f32_cuda_vs_cpu"] = int((exp2_f32(y) != exp2_f32(y.cuda()).cpu()).sum())

from kdalab.inputs.draw import make_inputs  # noqa: E402
from kdalab.studies.sweep import plan_runs  # noqa: E402
from kdalab.kda.intra import kernel_l  # noqa: E402
from kdalab.kda.recipe import SEED  # noqa: E402

for fam, chunk in (("model_like", 16), ("weak_decay_correlated", 16), ("floor", 16)):
    specs = plan_runs([fam], [chunk], range(20), [128], [-5.0])
    inp = [make_inputs(s.family, s.chunk, s.dim, s.seed, -5.0, "cpu") for s in specs]
    k = torch.stack([i.keys for i in inp])
    g = torch.stack([i.log_decay for i in inp])
    b = torch.stack([i.beta for i in inp])
    cpu = kernel_l(k, g, b, SEED.with_(name="a", l_accumulation="h200-sgemm"))
    gpu = kernel_l(k.cuda(), g.cuda(), b.cuda(), SEED.with_(name="b", l_accumulation="gpu-h200-sgemm"))
    for field in ("decay", "inv_decay", "l"):
        p, q = getattr(cpu, field), getattr(gpu, field).cpu()
        res[f"{fam}{chunk}_{field}_cuda_vs_cpu"] = int(((p != q) & ~(p.isnan() & q.isnan())).sum())
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(OUT, "diag.json"), "w"), indent=1)

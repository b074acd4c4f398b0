"""One-off (issue 40): a forward+backward training step of ``kdalab.kernels.chunk_kda`` run a
few times, for Nsight Compute to profile its kernels (scripts/device/profile_backward.sh).

    python scripts/device/profile_backward.py --shape T4096_H16 --steps 2
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))

from bench_kernel import make_inputs  # noqa: E402
from bench_train import SHAPES, _leaves, _runners, _step  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="T4096_H16")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    x = _leaves(make_inputs(SHAPES[a.shape]))
    mine, _ = _runners(None)
    o, s = mine(x)
    gen = torch.Generator(device="cuda").manual_seed(0)
    do = torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype)
    dht = torch.randn(s.shape, device="cuda", generator=gen)
    for _ in range(a.steps):
        _step(mine, x, do, dht)
    torch.cuda.synchronize()
    print("steps done", a.shape, a.steps)


if __name__ == "__main__":
    main()

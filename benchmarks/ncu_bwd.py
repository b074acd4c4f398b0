"""One training step of kdalab's operator (forward + backward) at a bench_train shape, for a
profiler: ``benchmarks/h200.sh ncu`` runs it under Nsight Compute to read where the
backward's kernels stall (warp states, issue rate, occupancy, memory throughput), which
CUDA-event timings cannot say.

    python benchmarks/ncu_bwd.py [--shape T4096_H16] [--steps 2] [--bwd KEY=INT,...]

``--bwd``: autograd.BWD_MODE keys (a candidate). Prints the gradients' checksum, so that two
candidates' runs can be compared for agreement."""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_kernel import make_inputs  # noqa: E402
from bench_train import SHAPES, _leaves, _runners, _step  # noqa: E402

from kdalab.kernels import autograd  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="T4096_H16", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bwd", default="", help="BWD_MODE keys, KEY=INT,...")
    args = ap.parse_args()
    try:
        autograd.BWD_MODE.update(autograd.bwd_mode_settings(args.bwd))
    except ValueError as exc:
        ap.error(f"--bwd: {exc}")
    x = _leaves(make_inputs(SHAPES[args.shape]))
    mine, _ = _runners(None)
    o, s = mine(x)
    do, dht = torch.randn_like(o), torch.randn_like(s)
    for _ in range(args.steps):
        grads = _step(mine, x, do, dht)
    torch.cuda.synchronize()
    print("BWD_MODE", autograd.BWD_MODE)
    print("checksum", [float(g.double().abs().sum()) for g in grads])


if __name__ == "__main__":
    main()

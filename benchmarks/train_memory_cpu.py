"""The bytes a ``kdalab.kernels.chunk_kda`` training step allocates, counted on the CPU.

    python benchmarks/train_memory_cpu.py [--shapes B,T,H;B,T,H] [--json out.json]

Allocation is a host decision: which buffers a forward and backward create, and when they are
freed, does not depend on what the kernels compute. So the step runs here with every Triton
launch stubbed out (nothing computed), every ``torch.empty*`` replaced by its zero-filled twin
(so that its pages are touched), and the peak resident set (``VmHWM``, reset before the step)
above the inputs is the step's peak allocation: blocks this large are mmap'd by glibc and
returned when freed. Inputs bf16, K = V = 128, the lower-bounded gate, a final state and its
gradient, states VK (bench_train.py's step). The H200's caching allocator rounds blocks and
keeps freed ones, so its ``max_memory_allocated`` is compared in BENCHMARKS.md, not equal
(train_h200: 529 and 4103 MiB measured there where this counted 607 and 4128 before the
backward's buffers changed). Linux only (``/proc/self``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = "1,1024,16;1,4096,16;1,8192,64"


def _rss(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_mib(B, T, H, K=128):
    """The step's peak allocation above its inputs, MiB (this process's kernels stubbed)."""
    import torch

    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, dtype=dtype).requires_grad_(True)

    from kdalab.kernels import chunk_kda

    q, k, v, g = (leaf(B, T, H, K) for _ in range(4))
    beta = leaf(B, T, H)
    A_log, dt_bias = leaf(H, dtype=torch.float32), leaf(H * K, dtype=torch.float32)
    do = torch.randn(B, T, H, K, dtype=torch.bfloat16)
    dht = torch.randn(B, H, K, K)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    base = _rss("VmRSS")
    o, s = chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, output_final_state=True,
                     state_layout="VK")
    grads = torch.autograd.grad((o, s), [q, k, v, g, beta, A_log, dt_bias], (do, dht))
    del o, s, grads
    return (_rss("VmHWM") - base) / 2 ** 20


def _stub():
    """Launches do nothing, allocations are touched, the device checks pass on the CPU."""
    import torch
    from triton.runtime.jit import JITFunction

    JITFunction.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    torch.empty = lambda *a, **k: torch.zeros(*a, **k)
    torch.empty_like = lambda *a, **k: torch.zeros_like(*a, **k)
    torch.Tensor.new_empty = lambda self, *a, **k: self.new_zeros(*a, **k)
    import kdalab.kernels.api as api
    import kdalab.kernels.autograd as autograd
    import kdalab.kernels.contract as contract

    contract.device_ok = api.device_ok = lambda *a, **k: None
    api._sm_count = autograd._sm_count = lambda device: 132  # the H200's SMs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="B,T,H;B,T,H...")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's shape
    args = ap.parse_args()
    if args.one:  # one shape a process: an earlier shape's freed blocks never count
        _stub()
        print(json.dumps(dict(peak_mib=peak_mib(*map(int, args.one.split(","))))))
        return
    rows = []
    for shape in args.shapes.split(";"):
        out = subprocess.run([sys.executable, __file__, "--one", shape], capture_output=True,
                             text=True, check=True)
        mib = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
        B, T, H = shape.split(",")
        print(f"B {B} T {T} H {H}: peak {mib:.0f} MiB above the inputs", flush=True)
        rows.append(dict(target=f"train step B {B} T {T} H {H}: peak allocation above the "
                         "inputs (CPU count, kernels stubbed)", value=round(mib), unit="MiB"))
    if args.json:
        doc = dict(benchmark=os.path.basename(args.json)[:-5],
                   device="CPU (allocation count; dev VM, torch "
                          f"{__import__('torch').__version__})",
                   date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                   commit=os.environ.get("KDALAB_COMMIT", "unknown"),
                   command="python benchmarks/train_memory_cpu.py " + " ".join(sys.argv[1:]),
                   rows=rows)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()

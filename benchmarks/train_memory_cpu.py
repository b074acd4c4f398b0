"""The bytes a ``kdalab.kernels.chunk_kda`` training step allocates, counted on the CPU.

    python benchmarks/train_memory_cpu.py [--shapes NAME;B,T,H;...] [--json out.json]
        [--no-fla] [--bwd KEY=INT,...]

Allocation is a host decision: which buffers a forward and backward create, and when they are
freed, does not depend on what the kernels compute. So the step runs here with every Triton
launch stubbed out (nothing computed) under torch's profiler with ``profile_memory``: its
allocator events carry the bytes allocated and not yet freed after each allocation or free,
and the step's peak above its start is the figure ``torch.cuda.max_memory_allocated`` gives on
a GPU (bench_train.py's ``peak_mb``), without the caching allocator's rounding. A shape is
one of bench_train.py's or "B,T,H" (K = V = 128, fixed length, no initial state), and the
step is bench_train.py's (its inputs drawn on the CPU, its calls of kdalab's and fla's
``chunk_kda``, its upstream gradients); kdalab's and fla's (when installed) each run in a
process of its own.
Checked against the H200 (train_h200, ``max_memory_allocated`` at 9bbff03's buffers) on its
six shapes: fla 121.6, 483.2, 3862.0, 3894.0, 3890.0, 7748.0 MiB here (T 1024 H 16, T 4096
H 16, T 8192 H 64, the two varlen, B 8 T 4096 H 32 with states), 122, 483, 3862, 3894, 3890,
7748 there; kdalab 145.0, 469.0, 3496.8 at 7f6f5ff (its blocks kernel with 4, 4, 1 fewer
persistent programs of 295 KB of scratch), 147, 471, 3498 there. The earlier count, the
peak resident set with every buffer zero-filled, gave kdalab 224, 564, 3575 (it also counted
freed blocks the C library had not returned). The step takes the H200's path: the backward's
Gluon blocks kernel where it fits (``_stub``; its scratch is not the Triton kernel's), the
Gluon dS pass's buffers being the Triton pass's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

#: bench_train.py's (train_h200's) six
SHAPES = "T1024_H16;T4096_H16;T8192_H64;varlen6_H64;varlen1024x8_H64;B8_T4096_H32_state"


def _step_fn(kernel, shape):
    """bench_train.py's step (its inputs, drawn on the CPU, its calls of kdalab and fla, its
    upstream gradients), as its ``peak_mb`` measures it on a GPU, at ``shape``: one of its
    shape names, or "B,T,H" (K = V = 128, fixed length, no initial state)."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_train as bt
    from bench_kernel import make_inputs

    if "," in shape:
        B, T, H = map(int, shape.split(","))
        spec = (shape, B, T, H, None, False)
    else:
        spec = bt.SHAPES[shape]
    x = bt._leaves(make_inputs(spec, device="cpu"))
    mine, theirs = bt._runners(bt._fla() if kernel == "fla" else None)
    fn = theirs if kernel == "fla" else mine
    o, s = fn(x)
    gen = torch.Generator().manual_seed(5)
    do, dht = torch.randn(o.shape, generator=gen).to(o.dtype), torch.randn(s.shape,
                                                                           generator=gen)
    del o, s

    def step():
        grads = bt._step(fn, x, do, dht)
        del grads

    return step


def peak_mib(kernel, shape):
    """A step's peak allocation above its start, MiB (this process's launches stubbed):
    ``shape`` a bench_train.py shape name, or "B,T,H" (K = V = 128, no initial state)."""
    step = _step_fn(kernel, shape)
    step()  # the tables and plans are built once and cached: a step as a training loop's
    return peak_of(step)


def peak_of(fn) -> float:
    """The most bytes ``fn()`` holds allocated at once above what was allocated before it,
    MiB, from the profiler's allocator events (tensors freed before it returns included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not mem:
        raise RuntimeError("the profiler recorded no allocation (profile_memory)")
    start = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    return (max(e["args"]["Total Allocated"] for e in mem) - start) / 2 ** 20


def _stub():
    """Launches do nothing (fla's autotuned kernels too); the device checks pass on the CPU."""
    from triton.runtime.jit import KernelInterface

    KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    import kdalab.kernels.api as api
    import kdalab.kernels.autograd as autograd
    import kdalab.kernels.chunk_blocks_bwd_ws as blocks_ws
    import kdalab.kernels.contract as contract

    contract.device_ok = api.device_ok = lambda *a, **k: None
    api._sm_count = autograd._sm_count = lambda device: 132  # the H200's SMs
    # the H200's path: the backward's Gluon blocks kernel where it fits (its scratch is not
    # the Triton kernel's); the Gluon dS pass allocates what the Triton one does
    autograd._hopper = lambda device: True
    blocks_ws.applies = blocks_ws.fits


def _child(kernel, shape, bwd=""):
    out = subprocess.run([sys.executable, __file__, "--one", f"{kernel}:{shape}",
                          *(["--bwd", bwd] if bwd else [])], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: the {kernel} step at {shape} failed: "
                         f"{out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="bench_train.py's shape names, or "
                    "B,T,H triples, separated by ';'")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-fla", action="store_true", help="kdalab only (fla: when installed)")
    ap.add_argument("--bwd", default="", help="KEY=INT,...: kdalab.kernels.autograd.BWD_MODE "
                    "keys for kdalab's step, e.g. ds_block_v=64 (bench_train's bwd.KEY)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's kernel:shape
    args = ap.parse_args()
    if args.one:  # one step a process: an earlier step's cached tables never count
        kernel, shape = args.one.split(":")
        _stub()
        if args.bwd:
            from kdalab.kernels import autograd

            try:
                autograd.BWD_MODE.update(autograd.bwd_mode_settings(args.bwd))
            except ValueError as exc:
                raise SystemExit(f"error: --bwd: {exc}") from None
        print(json.dumps(dict(peak_mib=peak_mib(kernel, shape))))
        return
    try:
        import fla  # noqa: F401
        with_fla = not args.no_fla
    except ImportError:
        with_fla = False
    rows = []
    for shape in args.shapes.split(";"):
        mib = _child("kdalab", shape, args.bwd)
        label = "B {} T {} H {}".format(*shape.split(",")) if "," in shape else shape
        row = dict(target=f"train step {label}: peak allocation above the inputs, "
                          f"kdalab{' (' + args.bwd + ')' if args.bwd else ''} (CPU count, "
                          "kernels stubbed)", value=round(mib, 1), unit="MiB")
        line = f"{label}: kdalab {mib:.1f} MiB"
        if with_fla:
            theirs = _child("fla", shape)
            row["note"] = f"fla {theirs:.1f} MiB (kdalab {mib / theirs:.3f}x fla's)"
            line += f", fla {theirs:.1f} MiB ({mib / theirs:.3f}x)"
        print(line, flush=True)
        rows.append(row)
    if args.json:
        doc = dict(benchmark=os.path.basename(args.json)[:-5],
                   device="CPU (profiler allocation count; dev VM, torch "
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

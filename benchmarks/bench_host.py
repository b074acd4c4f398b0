"""Host time a call of kdalab's Triton entry points, launch forms against each other (CPU).

    python benchmarks/bench_host.py [--rounds 7] [--calls 500] [--json PATH]

What the host does to issue a call — validation, tables, plan, buffers, the launch path —
measured on the CPU with Triton's compiled-kernel launcher stubbed (no GPU: the kernels are
never run), for the default ``replay`` (a seen call's launches replayed) against ``direct``
(every call through the entry point and the compiled kernel's launcher), docs/kernels.md
"Host overhead".
Forms are timed in interleaved rounds; each figure is the best round (the host's own cost,
least disturbed by other load), the ratio is direct over the form in the same run. Buffers
are CPU ``torch.empty`` here (page-mapped allocations), dearer than the CUDA caching
allocator's, so the absolute figures are this machine's; the H200's host is measured by
``bench_decode.py`` (host µs a call of each launch form; candidate ``launch_direct``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("bench_host.py: run it without TRITON_INTERPRET (the kernels must be compiled "
             "JIT functions, whose launcher it stubs)")

import torch  # noqa: E402
from triton import knobs  # noqa: E402

from kdalab.kernels import KernelConfig, chunk_kda_fwd, kda_decode  # noqa: E402
from kdalab.kernels import launch as L  # noqa: E402

FORMS = ("direct", "replay")
K = 128


class _Compiled:
    """Stands in for a compiled kernel: its launcher does nothing."""
    function = packed_metadata = 0

    def run(self, *args):
        pass


class _Table(dict):
    def get(self, key, default=None):
        return _COMPILED


_COMPILED = _Compiled()


def stub_launcher():
    """Every direct launch finds ``_COMPILED`` (as if Triton had compiled the kernel), on
    device 0's stream; the entry points' CPU check passes (TRITON_INTERPRET set now: the
    kernels, imported before, stay JIT functions)."""
    os.environ["TRITON_INTERPRET"] = "1"
    L._DRIVER[:] = [lambda: 0, lambda device: 0, knobs.runtime]
    table = L._table
    L._table = lambda fn: table(fn)[:4] + (_Table(),)


def workloads():
    """(name, {form: a function making one call}) for prefill T 1024 H 16 (plain, and through
    a pool with checkpoints every 64 tokens), B 128 T 64 H 16 and decode N 1 and N 128, H 16
    (bf16 inputs, the model's gate)."""
    out = []
    for name, B, T, H in (("prefill T1024_H16", 1, 1024, 16),
                          ("prefill B128_T64_H16", 128, 64, 16)):
        q = torch.randn(B, T, H, K, dtype=torch.bfloat16)
        x = (q, q.clone(), q.clone(), q.clone(), torch.randn(B, T, H, dtype=torch.bfloat16))
        gate = dict(A_log=torch.zeros(H), dt_bias=torch.zeros(H * K), lower_bound=-5.0)
        out.append((name, {f: (lambda x=x, gate=gate, cfg=KernelConfig(launch=f):
                               chunk_kda_fwd(*x, config=cfg, **gate)) for f in FORMS}))
        if T == 1024:  # through a pool with checkpoints every 64 tokens (a tensor descriptor)
            ck = dict(gate, state_pool=torch.zeros(2, H, K, K), state_indices=torch.tensor([1]),
                      checkpoint_every=64)
            out.append((f"{name} pool checkpoints", {
                f: (lambda x=x, ck=ck, cfg=KernelConfig(launch=f):
                    chunk_kda_fwd(*x, config=cfg, **ck)) for f in FORMS}))
    for N in (1, 128):
        H = 16
        q = torch.randn(N, 1, H, K, dtype=torch.bfloat16)
        x = (q, q.clone(), q.clone(), q.clone(), torch.randn(N, 1, H, dtype=torch.bfloat16))
        kw = dict(state_pool=torch.zeros(2 * N, H, K, K), state_indices=torch.arange(N),
                  A_log=torch.zeros(H), dt_bias=torch.zeros(H * K), lower_bound=-5.0)
        out.append((f"decode N{N}_H16", {f: (lambda x=x, kw=kw, f=f:
                                             kda_decode(*x, launch=f, **kw)) for f in FORMS}))
    return out


def measure(fns, rounds, calls):
    """Best µs a call of each function over ``rounds`` interleaved rounds of ``calls``."""
    for fn in fns.values():
        for _ in range(20):
            fn()  # the first call records the replayed form
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    stub_launcher()
    rows = []
    for name, fns in workloads():
        us = measure(fns, args.rounds, args.calls)
        print(json.dumps(dict(workload=name, **{f"{f}_us": v for f, v in us.items()})),
              flush=True)
        rows.append((name, us))
    out = []
    found = dict(rows)
    # one row a shape: decode N 128 in the note of N 1's, the checkpointed call in the plain
    # call's
    for name, us in rows:
        if name in ("decode N128_H16", "prefill T1024_H16 pool checkpoints"):
            continue
        note = f"direct {us['direct']:.1f} us, replay {us['replay']:.1f} us a call"
        ck = found.get(f"{name} pool checkpoints")
        if ck:
            note += (f"; through a pool with checkpoints every 64 tokens: direct "
                     f"{ck['direct']:.1f}, replay {ck['replay']:.1f} us "
                     f"({ck['direct'] / ck['replay']:.2f}x)")
        if name == "decode N1_H16":
            n128 = found["decode N128_H16"]
            note += (f"; N 128: direct {n128['direct']:.1f}, replay {n128['replay']:.1f} us "
                     f"({n128['direct'] / n128['replay']:.2f}x)")
        out.append(dict(target=f"{name}: replay's speed-up over direct (host time a call)",
                        value=round(us["direct"] / us["replay"], 2), unit="x", note=note))
    for r in out:
        print(f"{r['target']}: {r['value']}x ({r['note']})")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        doc = dict(benchmark="host_overhead_cpu",
                   device=f"dev VM: {_cpu()}, "
                          f"{os.cpu_count()} cores, torch {torch.__version__}, launcher stubbed",
                   date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), commit=commit,
                   command="python " + " ".join(sys.argv), rows=out)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()

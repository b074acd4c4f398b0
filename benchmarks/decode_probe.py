"""Decode's state traffic under other cache hints and launch shapes, at the shapes nearest the
floor target (issue 43: N 128 H 12 ran at 1.14x the state-traffic floor, decode_h200).

    python benchmarks/decode_probe.py [--json PATH] [--shapes 128x12,128x24,256x12] [--rounds 7]

Variants (each ``kda_decode``'s kernel, its source with one change, so the rest is identical):
  default        decode.py as it is
  load_ef        the state's load with ``eviction_policy="evict_first"`` (read once a step)
  store_cs       the state's store with ``cache_modifier=".cs"`` (streaming: written once)
  both           both of the above
and launch shapes (BV/warps) 128/8 and 128/16 (one program a state-head). Each runs captured in
a CUDA graph (what a serving engine replays), the variants alternating within each round; the
median of the rounds' medians, over the floor (the bytes a step must move at the copy
bandwidth measured here, as bench_decode.py). Outputs and pool rows are compared with the
default's (a cache hint changes no arithmetic: same bits expected).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bench_decode import LOWER_BOUND, D, copy_bandwidth, decode_inputs  # noqa: E402

from kdalab.kernels import KernelConfig  # noqa: E402
from kdalab.kernels import decode as dec  # noqa: E402

LOAD = "mask=m0,\n                other=0.0).to(tl.float32)"
STORE = "S.to(pool_ptr.dtype.element_ty), mask=m0)"
EDITS = {
    "load_ef": [(LOAD, LOAD.replace("other=0.0)", 'other=0.0, eviction_policy="evict_first")'))],
    "store_cs": [(STORE, 'S.to(pool_ptr.dtype.element_ty), mask=m0, cache_modifier=".cs")')],
}
EDITS["both"] = EDITS["load_ef"] + EDITS["store_cs"]


def variant_kernel(name):
    """kda_decode_kernel with ``EDITS[name]`` applied to its source, compiled as its own JIT
    function in decode.py's namespace (so every helper and constant is the module's)."""
    src = inspect.getsource(dec.kda_decode_kernel.fn)
    for old, new in EDITS[name]:
        if src.count(old) != 1:
            raise SystemExit(f"decode_probe: decode.py changed, {name}'s edit no longer applies")
        src = src.replace(old, new)
    path = f"/tmp/kdalab_decode_probe_{name}.py"  # triton.jit reads the function's source file
    with open(path, "w") as fh:
        fh.write("import triton\nimport triton.language as tl\n"
                 "from kdalab.kernels.decode import _pool_ptrs, log2_decay, gate_params\n\n"
                 + src)
    spec = __import__("importlib.util").util.spec_from_file_location(f"probe_{name}", path)
    mod = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.kda_decode_kernel


def step_fn(x, kernel=None, config=KernelConfig()):
    def run():
        saved = dec.kda_decode_kernel
        if kernel is not None:
            dec.kda_decode_kernel = kernel
        try:
            return dec.kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  state_pool=x["pool"], state_indices=x["idx"],
                                  A_log=x["A_log"], dt_bias=x["dt_bias"],
                                  lower_bound=LOWER_BOUND, config=config)
        finally:
            dec.kda_decode_kernel = saved
    return run


def captured(fn):
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x12,128x24,256x12,512x12")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bw = copy_bandwidth()
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, copy_tb_s=bw / 1e12)
    print(json.dumps(info), flush=True)
    kernels = {name: variant_kernel(name) for name in EDITS}
    rows = []
    for shape in args.shapes.split(","):
        N, H = map(int, shape.split("x"))
        x = decode_inputs(N, H)
        pool0 = x["pool"].clone()
        fns = {"default": step_fn(x)}
        fns.update({name: step_fn(x, kernel) for name, kernel in kernels.items()})
        fns.update({f"bv{bv}_w{w}": step_fn(x, config=KernelConfig(block_v=bv, num_warps=w))
                    for bv, w in ((128, 8), (128, 16))})
        same = {}
        ref = None
        for name, fn in fns.items():  # one step from the same pool: outputs and rows
            x["pool"].copy_(pool0)
            o = fn()
            got = (o.clone(), x["pool"][x["idx"].long()].clone())
            if ref is None:
                ref = got
            same[name] = bool(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
        replays = {name: captured(fn) for name, fn in fns.items()}
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, replay in replays.items():
                times[name].append(triton.testing.do_bench(replay, warmup=10, rep=100,
                                                           return_mode="median"))
        moved = N * H * (2 * D * D * 4 + 4 * D * 2 + D * 2 + 2)
        floor_ms = moved / bw * 1e3
        row = dict(N=N, H=H, floor_ms=floor_ms)
        for name, ts in times.items():
            ms = statistics.median(ts)
            row[f"{name}_graph_ms"] = ms
            row[f"{name}_over_floor"] = ms / floor_ms
            row[f"{name}_same_bits"] = same[name]
        for name in fns:
            row[f"{name}_over_default"] = row[f"{name}_graph_ms"] / row["default_graph_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'shape':10s}" + "".join(f"{n:>12s}" for n in fns))
    for r in rows:
        print(f"{r['N']}x{r['H']:<7d}" + "".join(
            f"{r[f'{n}_over_floor']:11.3f}{'' if r[f'{n}_same_bits'] else '*'}" for n in fns))
    print("(x the floor; * bits differ from the default's)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(info=info, rows=rows, command=" ".join(sys.argv)), fh, indent=1)


if __name__ == "__main__":
    main()

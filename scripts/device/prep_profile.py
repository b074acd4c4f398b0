"""Where stage 1's time goes on many short sequences (issue 24 item 6): stage 1 alone under
launch variants that keep its bits (its register cap: the plan's, none, 168), checked bit
for bit against the default, timed in interleaved rounds; the whole forward
with each; FlashKDA's kernels one by one (torch.profiler); and with ``profile SHAPE`` one
stage-1 launch between cudaProfilerStart/Stop for Nsight Compute. One-off script of a
device call (prep_profile.sh)."""

import json
import sys

import torch
import triton

sys.path.insert(0, "benchmarks")
import bench_kernel  # noqa: E402
from bench_decode import SHORT  # noqa: E402
from bench_kernel import SHAPES, load_flashkda, make_inputs, run_kdalab  # noqa: E402

from kdalab.kernels import KernelConfig  # noqa: E402

VARIANTS = {  # name: KernelConfig; calls 1-3 (8013908, 94535aa, 76c7740) capped by hand
    "default": KernelConfig(), "uncapped": KernelConfig(prepare_maxnreg=0),
    "r168": KernelConfig(prepare_maxnreg=168),
}
SHAPE_OF = {s[0]: s for s in SHORT} | {"T8100_H64": ("T8100_H64", 1, 8100, 64, None, False)}


def variant(name, fn):
    return fn(VARIANTS[name])


def timings(names, rounds=3):
    for sname in names:
        shape = SHAPE_OF.get(sname) or SHAPES[sname]
        x = make_inputs(shape)
        s1 = {v: variant(v, lambda c: bench_kernel._stage1_fn(x, c)[0]) for v in VARIANTS}
        ref = s1["default"]()
        same = {}
        for v, f in s1.items():
            out = f()
            same[v] = all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ref, out))
        fw = {v: variant(v, lambda c: (lambda: run_kdalab(x, c))) for v in VARIANTS}
        ms = {f"s1_{v}": [] for v in VARIANTS} | {f"fwd_{v}": [] for v in VARIANTS}
        for _ in range(rounds):
            for v in VARIANTS:
                ms[f"s1_{v}"].append(triton.testing.do_bench(s1[v], warmup=10, rep=60,
                                                             return_mode="median"))
                ms[f"fwd_{v}"].append(triton.testing.do_bench(fw[v], warmup=10, rep=60,
                                                              return_mode="median"))
        med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
        print(json.dumps(dict(shape=sname, same_bits=same, ms=med)), flush=True)
        torch.cuda.empty_cache()


def flashkda_kernels(sname):
    fk = load_flashkda()
    if fk is None:
        return
    x = make_inputs(SHAPE_OF.get(sname) or SHAPES[sname])
    for _ in range(3):
        fk(x), run_kdalab(x)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    for who, fn in (("flashkda", lambda: fk(x)), ("kdalab", lambda: run_kdalab(x))):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        rows = [dict(kernel=e.key[:90], us=round(e.device_time_total / e.count, 1), n=e.count)
                for e in prof.key_averages() if e.device_time_total > 0]
        print(json.dumps(dict(shape=sname, who=who, kernels=rows)), flush=True)


def profile_stage1(sname):
    x = make_inputs(SHAPE_OF.get(sname) or SHAPES[sname])
    f = bench_kernel._stage1_fn(x, KernelConfig())[0]
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    if sys.argv[1] == "profile":
        profile_stage1(sys.argv[2])
    elif sys.argv[1] == "flashkda":
        for s in sys.argv[2:]:
            flashkda_kernels(s)
    else:
        timings(sys.argv[1:])

"""Where the checkpoints' cost goes (issue 24: checkpoints every 64 tokens cost 1.23-1.40x a
pool prefill): each serving call timed eagerly and as a CUDA-graph replay (the difference is
host time), checkpoints every 64, 128 and 256 tokens, fp32 and bf16 (does the cost follow
the checkpoints' count, or their bytes?), and with ``profile SHAPE`` one pool call and one
call with checkpoints between cudaProfilerStart/Stop for Nsight Compute. One-off script of
a device call (ck_profile.sh)."""

import json
import sys

import torch
import triton

sys.path.insert(0, "benchmarks")
from bench_kernel import LOWER_BOUND, SHAPES, D, make_inputs  # noqa: E402

from kdalab.kernels import chunk_kda_fwd, chunk_recurrent  # noqa: E402


def calls(name):
    x = make_inputs(SHAPES[name])
    n = x["q"].shape[0] if x["cu"] is None else x["cu"].numel() - 1
    H = x["q"].shape[2]
    pool = torch.randn(2 * n, H, D, D, device="cuda") * 0.1
    poolb = pool.bfloat16()
    idx = torch.randperm(2 * n, device="cuda")[:n]
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    gate = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
                cu_seqlens=x["cu"], state_layout="VK")

    def call(p, late, c=None):
        def fn():
            chunk_recurrent.CHECKPOINT_AFTER_LOADS = late
            return chunk_kda_fwd(*args, state_pool=p, state_indices=idx, checkpoint_every=c,
                                 **gate)
        return fn
    fns = {"pool": call(pool, False), "pool_bf16": call(poolb, False)}
    for late in (False, True):
        tag = "_late" if late else ""
        for c in (64, 256):
            fns[f"ck{c}{tag}"] = call(pool, late, c)
        fns[f"ck64_bf16{tag}"] = call(poolb, late, 64)
    return fns, pool, poolb


def same_bits(name):
    """The two placements store the same checkpoints and final states, bit for bit."""
    fns, pool, poolb = calls(name)
    for key in ("ck64", "ck64_bf16"):
        p = poolb if "bf16" in key else pool
        p0 = p.clone()
        out = []
        for k in (key, key + "_late"):
            p.copy_(p0)
            _, _, ck = fns[k]()
            out.append((ck.clone(), p.clone()))
        p.copy_(p0)
        print(json.dumps(dict(shape=name, check=key, checkpoints_equal=torch.equal(
            out[0][0], out[1][0]), pool_equal=torch.equal(out[0][1], out[1][1]))), flush=True)


def timings(names, rounds=3):
    for name in names:
        same_bits(name)
        fns = calls(name)[0]
        times = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        for _ in range(rounds):  # interleaved: drifts fall on every candidate alike
            for key, fn in fns.items():
                times[key].append(triton.testing.do_bench(fn, warmup=5, rep=60,
                                                          return_mode="median"))
        row = dict(shape=name, rounds=rounds)
        for key, ts in times.items():
            row[f"{key}_ms"] = sorted(ts)[len(ts) // 2]
        for key in fns:
            base = row["pool_bf16_ms"] if "bf16" in key else row["pool_ms"]
            row[f"{key}_x"] = round(row[f"{key}_ms"] / base, 4)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


def profile(name):
    fns = calls(name)[0]
    for _ in range(3):
        fns["pool"](), fns["ck64"]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fns["pool"]()
    fns["ck64"]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    if sys.argv[1] == "profile":
        profile(sys.argv[2])
    else:
        timings(sys.argv[1:])

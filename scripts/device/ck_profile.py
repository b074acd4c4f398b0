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

from kdalab.kernels import chunk_kda_fwd  # noqa: E402


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
    fns = {"pool": lambda: chunk_kda_fwd(*args, state_pool=pool, state_indices=idx, **gate),
           "pool_bf16": lambda: chunk_kda_fwd(*args, state_pool=poolb, state_indices=idx,
                                              **gate)}
    for c in (64, 128, 256):
        fns[f"ck{c}"] = lambda c=c: chunk_kda_fwd(*args, state_pool=pool, state_indices=idx,
                                                  checkpoint_every=c, **gate)
    fns["ck64_bf16"] = lambda: chunk_kda_fwd(*args, state_pool=poolb, state_indices=idx,
                                             checkpoint_every=64, **gate)
    return fns


def timings(names):
    for name in names:
        fns = calls(name)
        row = dict(shape=name)
        for key, fn in fns.items():
            fn()
            torch.cuda.synchronize()
            row[f"{key}_eager_ms"] = triton.testing.do_bench(fn, warmup=10, rep=150,
                                                             return_mode="median")
            row[f"{key}_graph_ms"] = triton.testing.do_bench_cudagraph(fn, rep=150,
                                                                       return_mode="median")
        for mode in ("eager", "graph"):
            base = row[f"pool_{mode}_ms"]
            for key in fns:
                row[f"{key}_{mode}_x"] = round(row[f"{key}_{mode}_ms"] / base, 4)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


def profile(name):
    fns = calls(name)
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

"""Host time of one eager prefill call, and where it goes (cProfile), at a short shape:
``python scripts/device/host_profile.py [--shape T1024_H16] [--calls 300]`` on a CUDA device.
Prints host us a call (queued back to back, no sync inside), the GPU time a call (CUDA-graph
replay) and the top of cProfile's table by internal time."""
import argparse
import cProfile
import io
import pstats
import time

import torch
import triton

from kdalab.kernels import KernelConfig, chunk_kda_fwd

ap = argparse.ArgumentParser()
ap.add_argument("--T", type=int, default=1024)
ap.add_argument("--H", type=int, default=16)
ap.add_argument("--calls", type=int, default=300)
ap.add_argument("--configs", default="auto;stage2=triton")
a = ap.parse_args()
dev = "cuda"
B, T, H, K = 1, a.T, a.H, 128
g = torch.Generator(device=dev).manual_seed(0)
bf = dict(device=dev, dtype=torch.bfloat16)
q, k, v = (torch.randn(B, T, H, K, generator=g, **bf) for _ in range(3))
gate = torch.randn(B, T, H, K, generator=g, **bf)
beta = torch.randn(B, T, H, generator=g, **bf)
A_log = torch.zeros(H, device=dev)
dt_bias = torch.zeros(H * K, device=dev)
print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
for spec in a.configs.split(";"):
    fields = {} if spec == "auto" else dict(kv.split("=") for kv in spec.split(","))
    cfg = KernelConfig(**{f: int(x) if x.isdigit() else x for f, x in fields.items()})

    def fn(cfg=cfg):
        return chunk_kda_fwd(q, k, v, gate, beta, A_log=A_log, dt_bias=dt_bias, config=cfg)

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.calls):
        fn()
    host = (time.perf_counter() - t0) / a.calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / a.calls * 1e6
    graph = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    print(f"{spec}: host {host:.1f} us a call, wall {wall:.1f} us a call, graph {graph:.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[-6000:])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue()[-6000:])

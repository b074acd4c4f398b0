"""Host time of one eager prefill call, and where it goes (cProfile), at a short shape:
``python scripts/device/host_profile.py [--T 1024] [--H 16] [--calls 300]`` on a CUDA device.
Prints host us a call (queued back to back, no sync inside), the GPU time a call (CUDA-graph
replay) and the top of cProfile's table by internal time. ``--cpu``: kdalab's own Python alone,
on CPU tensors with the two Triton launches replaced by no-ops (no kernel runs; the best of 5
rounds of ``--calls``)."""
import argparse
import cProfile
import io
import os
import pstats
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--T", type=int, default=1024)
ap.add_argument("--H", type=int, default=16)
ap.add_argument("--calls", type=int, default=300)
ap.add_argument("--configs", default="auto;stage2=triton")
ap.add_argument("--cpu", action="store_true")
a = ap.parse_args()
if a.cpu:
    os.environ["TRITON_INTERPRET"] = "1"  # kdalab.kernels accepts CPU tensors then

import torch  # noqa: E402
import triton  # noqa: E402

from kdalab.kernels import KernelConfig, chunk_kda_fwd  # noqa: E402

dev = "cpu" if a.cpu else "cuda"
B, T, H, K = 1, a.T, a.H, 128
g = torch.Generator(device=dev).manual_seed(0)
bf = dict(device=dev, dtype=torch.bfloat16)
q, k, v = (torch.randn(B, T, H, K, generator=g, **bf) for _ in range(3))
gate = torch.randn(B, T, H, K, generator=g, **bf)
beta = torch.randn(B, T, H, generator=g, **bf)
A_log = torch.zeros(H, device=dev)
dt_bias = torch.zeros(H * K, device=dev)
if a.cpu:
    from kdalab.kernels import chunk_prepare, chunk_recurrent

    class _NoLaunch:  # kernel[grid](...) does nothing
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    chunk_prepare.chunk_kda_prepare_kernel = _NoLaunch()
    chunk_recurrent.chunk_kda_recurrent_kernel = _NoLaunch()

    def fn():
        return chunk_kda_fwd(q, k, v, gate, beta, A_log=A_log, dt_bias=dt_bias)

    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / a.calls * 1e6)
    print(f"kdalab's Python alone (launches replaced by no-ops): {best:.1f} us a call")
    sys.exit(0)
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

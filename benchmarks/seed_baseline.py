"""The seed document's per-run code, kept as the baseline of benchmarks/bench_gpu_sweep.py and as
the reference of tests/test_families.py: its ``make_inputs`` and ``run_one`` (CUDA path: one
``cublasGemmEx`` with COMPUTE_16F per product, a device synchronization before and after), in
the seed's arithmetic and order. It depends on kdalab only for the cuBLAS call
(``kdalab.arith.gpu.cublas_gemm_single``), imported when a product runs.
"""

from __future__ import annotations

import math

import torch

LOG2E = math.log2(math.e)


def seed_make_inputs(family, chunk, dim, seed, lower_bound=-5.0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if family == "weak_decay_correlated":
        key = torch.randn(1, dim, dtype=torch.float64, generator=gen)
        key = key / key.norm(dim=-1, keepdim=True)
        keys = key.expand(chunk, -1)
        log_decay = torch.full((chunk,), -0.01, dtype=torch.float64)
        beta = torch.full((chunk,), 0.5, dtype=torch.float64)
    else:
        keys = torch.randn(chunk, dim, dtype=torch.float64, generator=gen)
        keys = keys / keys.norm(dim=-1, keepdim=True)
        if family == "floor":
            log_decay = torch.full((chunk,), lower_bound, dtype=torch.float64)
        else:
            gate = torch.randn(chunk, dtype=torch.float64, generator=gen)
            log_decay = lower_bound * torch.sigmoid(gate)
        beta = torch.sigmoid(torch.randn(chunk, dtype=torch.float64, generator=gen))
    return keys.to(torch.bfloat16), log_decay, beta


def _seed_mm(a, b):
    from kdalab.arith import gpu

    torch.cuda.synchronize(a.device)
    out = gpu.cublas_gemm_single(a, b)
    torch.cuda.synchronize(a.device)
    return out


def seed_neumann(l, mm=None):
    """The seed's neumann_inverse_fp16 with its fp16 product ``mm`` (default: its GPU path,
    one cuBLAS call per product); returns (inverse, highest power, max |power|)."""
    mm = _seed_mm if mm is None else mm
    n = l.shape[0]
    inv = (torch.eye(n, dtype=torch.float16, device=l.device) - l).half()
    power, exponent, max_power = l, 1, float(l.abs().max())
    while exponent * 2 < n:
        power = mm(power, power)
        exponent *= 2
        max_power = max(max_power, float(power.abs().max()))
        inv = (inv + mm(inv, power)).half()
    return inv, exponent, max_power


def _exp2_ftz_f32(x):
    y = torch.exp2(x.float())
    return torch.where(y < torch.finfo(torch.float32).tiny, 0.0, y)


def _rel_rmse(actual, expected):
    if not torch.isfinite(actual).all():
        return math.inf
    error = (actual.double() - expected.double()).square().mean().sqrt()
    scale = expected.double().square().mean().sqrt()
    return float(error / (scale + 1e-30))


def seed_run_one(keys, log_decay, beta):
    chunk = keys.shape[0]
    device = keys.device
    keys64 = keys.double()
    cumsum = log_decay.cumsum(0)
    dots = keys64 @ keys64.t()
    decay_ratio = torch.exp((cumsum[:, None] - cumsum[None, :]).clamp(max=0.0))
    l_ref = torch.tril(dots * decay_ratio * beta[:, None], diagonal=-1)
    identity = torch.eye(chunk, dtype=torch.float64, device=device)
    inv_ref = torch.linalg.inv(identity + l_ref)
    cumsum_log2 = log_decay.cumsum(0) * LOG2E
    decay = _exp2_ftz_f32(cumsum_log2).bfloat16()
    inv_decay = _exp2_ftz_f32(-cumsum_log2).bfloat16()
    l_kernel = (keys * decay[:, None]).float() @ (keys * inv_decay[:, None]).float().t()
    l_kernel = torch.tril(l_kernel.half(), diagonal=-1)
    l_kernel = (l_kernel * beta.half()[:, None]).half()
    stable_inv, _, stable_max = seed_neumann(l_ref.half())
    kernel_inv, kernel_power, kernel_max = seed_neumann(l_kernel)
    residual = _rel_rmse((identity + l_ref) @ kernel_inv.double(), identity)
    if torch.isfinite(l_kernel).all():
        neumann_only = _rel_rmse(kernel_inv, torch.linalg.inv(identity + l_kernel.double()))
    else:
        neumann_only = math.inf
    return kernel_inv, {
        "l_rel_rmse": _rel_rmse(l_kernel, l_ref),
        "inv_total_rel_rmse": _rel_rmse(kernel_inv, inv_ref),
        "inv_neumann_only_rel_rmse": neumann_only,
        "inv_stable_l_rel_rmse": _rel_rmse(stable_inv, inv_ref),
        "inverse_residual": residual,
        "highest_power": kernel_power, "kernel_power_max": kernel_max,
    }

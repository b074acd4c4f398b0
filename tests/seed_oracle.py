"""The seed document's experiment code, the oracle of tests/test_golden.py, test_families.py,
test_inverse.py and test_accumulate.py, and the baseline that benchmarks/bench_gpu_sweep.py and
bench_sweep_whole.py time kdalab against: its ``make_inputs``,
``fp16_accum_mm`` (the CPU fallback rounding after every product; on CUDA one ``cublasGemmEx``
with COMPUTE_16F per product, a device synchronization before and after),
``neumann_inverse_fp16``, ``stable_l``, ``kernel_l``, ``rel_rmse`` and ``run_one``, in the seed's
arithmetic and order, with the seed's names prefixed ``seed_``.

Two changes, neither touching the arithmetic: the cuBLAS call goes through kdalab's binding
(``kdalab.arith.gpu.cublas.cublas_gemm_single``, the same ``cublasGemmEx`` call, imported when a
CUDA product runs), and :func:`seed_make_inputs` takes the sigmoid as an argument (default
``torch.sigmoid``, the seed's), so tests/test_golden.py can show that a difference from the stored
runs comes from the platform's sigmoid alone.
"""

from __future__ import annotations

import math

import torch

LOG2E = math.log2(math.e)
#: the seed's case names for (family, lower bound −5)
SEED_CASES = {"floor": "floor_e-5", "weak_decay_correlated": "weak_decay_correlated",
              "model_like": "model_like"}


def seed_make_inputs(family, chunk, dim, seed, lower_bound=-5.0, sigmoid=torch.sigmoid):
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
            log_decay = lower_bound * sigmoid(gate)
        beta = sigmoid(torch.randn(chunk, dtype=torch.float64, generator=gen))
    return keys.to(torch.bfloat16), log_decay, beta


def _cublas_mm(a, b):
    from kdalab.arith.gpu.cublas import cublas_gemm_single

    torch.cuda.synchronize(a.device)
    out = cublas_gemm_single(a, b)
    torch.cuda.synchronize(a.device)
    return out


def seed_fp16_accum_mm(a, b):
    """The seed's ``fp16_accum_mm``: cuBLAS COMPUTE_16F on CUDA, else its CPU fallback."""
    if a.is_cuda:
        return _cublas_mm(a, b)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16, device=a.device)
    for k in range(a.shape[1]):
        product = a[:, k:k + 1].float() * b[k:k + 1].float()
        out = (out.float() + product).half()
    return out


def seed_neumann(l, mm=seed_fp16_accum_mm):
    """The seed's ``neumann_inverse_fp16`` with its fp16 product ``mm``; returns (inverse,
    highest power, max |power|)."""
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


def seed_stable_l(keys, log_decay, beta):
    keys64 = keys.double()
    cumsum = log_decay.cumsum(0)
    dots = keys64 @ keys64.t()
    decay_ratio = torch.exp((cumsum[:, None] - cumsum[None, :]).clamp(max=0.0))
    return torch.tril(dots * decay_ratio * beta[:, None], diagonal=-1)


def seed_kernel_l(keys, log_decay, beta):
    cumsum_log2 = log_decay.cumsum(0) * LOG2E
    decay = _exp2_ftz_f32(cumsum_log2).bfloat16()
    inv_decay = _exp2_ftz_f32(-cumsum_log2).bfloat16()
    k_decayed = keys * decay[:, None]
    k_inverse = keys * inv_decay[:, None]
    l = (k_decayed.float() @ k_inverse.float().t()).half()
    l = torch.tril(l, diagonal=-1)
    l = (l * beta.half()[:, None]).half()
    return l, decay, inv_decay


def _rel_rmse(actual, expected):
    if not torch.isfinite(actual).all():
        return math.inf
    error = (actual.double() - expected.double()).square().mean().sqrt()
    scale = expected.double().square().mean().sqrt()
    return float(error / (scale + 1e-30))


def seed_run_one(keys, log_decay, beta, mm=seed_fp16_accum_mm):
    """The seed's ``run_one`` on drawn inputs: ``(kernel inverse, record)`` with the seed's keys
    (the seed's ``case``/``chunk``/``seed`` left to the caller)."""
    chunk = keys.shape[0]
    l_ref = seed_stable_l(keys, log_decay, beta)
    identity = torch.eye(chunk, dtype=torch.float64, device=keys.device)
    inv_ref = torch.linalg.inv(identity + l_ref)
    l_kernel, decay, inv_decay = seed_kernel_l(keys, log_decay, beta)
    stable_inv, stable_power, stable_max = seed_neumann(l_ref.half(), mm)
    kernel_inv, kernel_power, kernel_max = seed_neumann(l_kernel, mm)
    residual = _rel_rmse((identity + l_ref) @ kernel_inv.double(), identity)
    if torch.isfinite(l_kernel).all():
        neumann_only = _rel_rmse(kernel_inv, torch.linalg.inv(identity + l_kernel.double()))
    else:
        neumann_only = math.inf
    return kernel_inv, {
        "decay_zeros": int((decay == 0).sum()),
        "inv_decay_nonfinite": int((~torch.isfinite(inv_decay)).sum()),
        "l_finite": int(torch.isfinite(l_kernel).all()),
        "inv_finite": int(torch.isfinite(kernel_inv).all()),
        "l_rel_rmse": _rel_rmse(l_kernel, l_ref),
        "inv_total_rel_rmse": _rel_rmse(kernel_inv, inv_ref),
        "inv_neumann_only_rel_rmse": neumann_only,
        "inv_stable_l_rel_rmse": _rel_rmse(stable_inv, inv_ref),
        "inverse_residual": residual,
        "highest_power": kernel_power,
        "kernel_power_max": kernel_max,
        "stable_l_highest_power": stable_power,
        "stable_l_power_max": stable_max,
    }

"""The H200's special-function instructions as FlashKDA issues them (``setup.py`` builds it with
``--use_fast_math``; ``csrc/smxx/utils.cuh:38-53``, ``fwd_kernel1.cuh:257,294``):

==========================  =====================================================================
``tanh.approx.f32``         its sigmoid, ``tanh(x·½)·½ + ½`` (the gate and β)
``ex2.approx.ftz.f32``      2^G and 2^−G of the base-2 log-decay, ``__expf(A_log)`` (fast math:
                            ex2 of ``fl(A_log · fl(log2 e))``)
``rsqrt.approx.ftz.f32``    ``rsqrtf(Σx² + 1e-6)`` of the q/k normalization (fast math)
==========================  =====================================================================

All three run on the multi-function unit and are not correctly rounded: the PTX ISA bounds
``tanh.approx.f32`` by a relative error of 2⁻¹¹ (so FlashKDA's sigmoid is off by up to ~2⁻¹²
absolutely: far more than float32's rounding), ``ex2.approx`` and ``rsqrt.approx`` by a couple of
float32 ulps.

The models here are the correctly rounded functions with the instructions' flush-to-zero, until
the H200's own results are measured (``scripts/device/flashkda_golden.py`` sweeps each
instruction over whole binades; the tables it writes replace these functions where they cover
the input). :data:`MEASURED` says which instruction is modelled from measurement.
"""

from __future__ import annotations

import torch

from kdalab.arith.exp2 import exp2_ftz

__all__ = ["tanh_approx", "ex2_approx_ftz", "rsqrt_approx_ftz", "MEASURED"]

#: instruction -> whether its model is the H200's measured table (else the correctly rounded
#: function)
MEASURED = {"tanh.approx.f32": False, "ex2.approx.ftz.f32": False,
            "rsqrt.approx.ftz.f32": False}

_TINY = 2.0**-126


def _ftz_input(x: torch.Tensor) -> torch.Tensor:
    """``.ftz``: subnormal inputs read as sign-preserving zero."""
    x = x.float()
    return torch.where(x.abs() < _TINY, x * 0.0, x)


def tanh_approx(x: torch.Tensor) -> torch.Tensor:
    """``tanh.approx.f32`` of float32 ``x`` (see module doc for what models it)."""
    x = _ftz_input(x)
    return torch.tanh(x.double()).float()


def ex2_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``ex2.approx.ftz.f32`` of float32 ``x``."""
    return exp2_ftz(_ftz_input(x))


def rsqrt_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``rsqrt.approx.ftz.f32`` of float32 ``x``."""
    x = _ftz_input(x)
    return torch.rsqrt(x.double()).float()

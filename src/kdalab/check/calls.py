"""The primitives of measuring a kernel: one call on fresh copies of the inputs (what it raised,
which inputs it modified, whether the device survived), bit comparison and the error measures."""

from __future__ import annotations

import math

import torch

from kdalab.arith import rel_rmse
from kdalab.check.adapters import ConventionError, KernelAdapter
from kdalab.check.cases import CaseInputs

__all__ = ["DeviceFault", "Raised", "call", "bits_equal", "same", "rel", "max_abs",
           "max_diff", "nonfinite", "message", "worst_rel_diff"]


class DeviceFault(Exception):
    """The device is in an error state after a kernel failed on it."""


_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits (same dtype), or the same value (NaN equal to NaN) when the
    dtypes differ."""
    if a.dtype == b.dtype and a.dtype.is_floating_point:
        return a.contiguous().view(_INTS[a.element_size()]) == \
            b.contiguous().view(_INTS[b.element_size()])
    a64, b64 = a.double(), b.double()
    return (a64 == b64) | (a64.isnan() & b64.isnan())


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(bits_equal(a, b).all())


def rel(a: torch.Tensor, e: torch.Tensor) -> float:
    if a.numel() == 0:
        return math.nan
    return float(rel_rmse(a.reshape(1, -1), e.reshape(1, -1), 1)[0])


def max_abs(a: torch.Tensor, e: torch.Tensor) -> float:
    if a.numel() == 0:
        return math.nan
    d = (a.double() - e.double()).abs()
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


def worst_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a − b| / max|b| (NaN against NaN counts as equal; any other non-finite: inf)."""
    if a.numel() == 0:
        return math.nan
    a64, b64 = a.double(), b.double()
    both_nan = a64.isnan() & b64.isnan()
    d = torch.where(both_nan, torch.zeros_like(a64), (a64 - b64).abs())
    if not bool(torch.isfinite(d).all()):
        return math.inf
    fin = b64[torch.isfinite(b64)]
    scale = float(fin.abs().max()) if fin.numel() else 0.0
    return float(d.max()) / (scale + 1e-30)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``|a - b|`` (NaN against NaN counts as equal; any other non-finite: inf)."""
    if a.numel() == 0:
        return 0.0
    a64, b64 = a.double(), b.double()
    d = torch.where(a64.isnan() & b64.isnan(), torch.zeros_like(a64), (a64 - b64).abs())
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


def nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


def message(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _device_ok(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except Exception as exc:  # a sticky CUDA error: every later call would fail alike
        return message(exc)
    return None


class Raised(Exception):
    """A kernel raised. ``declared``: it raised NotImplementedError, its way of saying that it
    does not support the case; anything else is a failure of the case."""

    def __init__(self, exc: BaseException):
        self.declared = isinstance(exc, NotImplementedError)
        first = message(exc)
        if isinstance(exc, ConventionError):  # it ran, and answered off the convention
            super().__init__(first)
            return
        super().__init__(first if self.declared else f"raised {type(exc).__name__}: {first}")


def call(kernel: KernelAdapter, x: CaseInputs, where: str, upstream=None):
    """One call on fresh copies of the inputs: ``((o, s), names of inputs it modified)``; with
    ``upstream`` (``(do, dht)``) its backward too: ``((o, s, gradients), ...)``
    (:meth:`~kdalab.check.adapters.KernelAdapter.differentiate`)."""
    work = x.clone()
    try:
        out = kernel(work) if upstream is None else kernel.differentiate(work, *upstream)
        o = out[0]
        if o.device.type == "cuda":
            torch.cuda.synchronize(o.device)
    except ConventionError as exc:  # a wrong answer (None, a shape, a dtype): this case fails
        raise Raised(exc) from exc
    except (Exception, SystemExit) as exc:  # a kernel that calls sys.exit() fails the case
        fault = _device_ok(x.q.device)
        if fault is not None:
            raise DeviceFault(f"kernel {kernel.name!r} on case {where!r} left the device in "
                              f"an error state: {fault}") from exc
        raise Raised(exc) from exc
    original = x.tensors()
    modified = [n for n, t in work.tensors().items() if not same(t, original[n])]
    return out, modified



"""A kernel's float32 scalar arithmetic outside its matrix products, as a value.

The gate, β, the q/k normalization and the decay factors of a chunked KDA kernel are float32
elementwise work: a sigmoid, exp2 of the log-decay, a reciprocal square root, and the running sum
of the log-decay over a chunk. How a kernel computes each decides bits of its output as surely as
its GEMM orders do. :class:`ScalarOps` names the choice for each:

=============  ===============================================================================
``sigmoid``    ``"torch"``: float32 ``torch.sigmoid``. ``"tanh.approx"``: FlashKDA's form
               ``fma(tanh(x·½), ½, ½)`` with the H200's ``tanh.approx.f32``
               (:func:`kdalab.arith.sm90.sigmoid_tanh`).
``exp2``       ``"exact"``: 2^x correctly rounded to float32, results below 2⁻¹²⁶ flushed to zero
               (:func:`kdalab.arith.exp2.exp2_ftz`). ``"ex2.approx"``: the H200's
               ``ex2.approx.ftz.f32`` (:func:`kdalab.arith.sm90.ex2_approx_ftz`).
``rsqrt``      ``"torch"``: float32 ``torch.rsqrt``. ``"rsqrt.approx"``: the H200's
               ``rsqrt.approx.ftz.f32`` (:func:`kdalab.arith.sm90.rsqrt_approx_ftz`).
``cumsum``     ``"torch"``: ``torch.cumsum`` (on the CPU it accumulates float32 in float64 and
               rounds each prefix once). ``"sequential"``: one float32 addition per term, each
               rounded, in order (a kernel's loop over the chunk's rows).
=============  ===============================================================================

Values: ``torch`` (every recipe's default: what torch does on the CPU) and ``sm90`` (FlashKDA on
the H200: its kernel, and its torch reference, which on the H200 gives the kernel's bits). They
apply to float32 arithmetic; float64 paths ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith.exp2 import exp2_ftz

__all__ = ["ScalarOps", "TORCH_OPS", "SM90_OPS", "SCALAR_OPS",
           "get_scalar_ops", "sequential_cumsum"]

_CHOICES = {
    "sigmoid": ("torch", "tanh.approx"),
    "exp2": ("exact", "ex2.approx"),
    "rsqrt": ("torch", "rsqrt.approx"),
    "cumsum": ("torch", "sequential"),
}


def sequential_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Prefix sums along ``dim`` in ``x``'s dtype, one rounded addition per term, in order."""
    dim = dim % x.dim()
    acc = torch.zeros_like(x.select(dim, 0))
    out = []
    for i in range(x.shape[dim]):
        acc = acc + x.select(dim, i)
        out.append(acc)
    return torch.stack(out, dim=dim)


@dataclass(frozen=True)
class ScalarOps:
    """How the float32 elementwise functions and the running sum are computed (module doc)."""

    name: str
    sigmoid: str = "torch"
    exp2: str = "exact"
    rsqrt: str = "torch"
    cumsum: str = "torch"

    def __post_init__(self) -> None:
        for field, allowed in _CHOICES.items():
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"scalar ops {self.name!r}: {field} must be one of "
                                 f"{', '.join(allowed)}, got {value!r}")

    def sigmoid_f32(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.sigmoid == "torch":
            return torch.sigmoid(x)
        from kdalab.arith.sm90 import sigmoid_tanh

        return sigmoid_tanh(x)

    def exp2_f32(self, x: torch.Tensor, *, ftz: bool = True) -> torch.Tensor:
        """2^x of float32 ``x`` (FTZ of results below 2⁻¹²⁶ unless ``ftz=False`` on the exact
        path; the instruction always flushes)."""
        if self.exp2 == "exact":
            return exp2_ftz(x, ftz=ftz)
        from kdalab.arith.sm90 import ex2_approx_ftz

        return ex2_approx_ftz(x)

    def rsqrt_f32(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.rsqrt == "torch":
            return torch.rsqrt(x)
        from kdalab.arith.sm90 import rsqrt_approx_ftz

        return rsqrt_approx_ftz(x)

    def cumsum_along(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        if self.cumsum == "sequential":
            return sequential_cumsum(x, dim)
        return x.cumsum(dim)


TORCH_OPS = ScalarOps("torch")
SM90_OPS = ScalarOps("sm90", sigmoid="tanh.approx", exp2="ex2.approx", rsqrt="rsqrt.approx",
                     cumsum="sequential")
SCALAR_OPS: dict[str, ScalarOps] = {o.name: o for o in (TORCH_OPS, SM90_OPS)}


def get_scalar_ops(spec: str | ScalarOps) -> ScalarOps:
    if isinstance(spec, ScalarOps):
        return spec
    try:
        return SCALAR_OPS[spec]
    except KeyError:
        raise ValueError(f"unknown scalar ops {spec!r}; expected one of "
                         f"{', '.join(SCALAR_OPS)}") from None

"""float64 products and inverses of batches whose every matrix gets the bits of the same call on
that matrix alone.

Why: on the CPU, torch's float64 matmul and inverse (MKL, LAPACK) take another path for a matrix
that does not start on a 16-byte boundary, and in a contiguous batch of float64 M×N matrices with
M·N odd every other matrix does not. Measured on an AVX2 AMD EPYC (torch 2.13, MKL 2024.2): of 64
random 17×17 matrices, 18 products and 28 inverses differed in the last bits from the same call on
each matrix alone; at 16×16 and 18×18, none. The inverse experiment's records would then depend
on which runs share a batch (caught by tests/test_sweep.py), and differ from the seed's per-run
calls. Here a product writes into a buffer whose matrices are 64-byte aligned, and an inverse of
odd size runs per matrix. Even sizes and CUDA tensors take torch's batched calls unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["matmul64", "inv64", "lead_shape"]


def lead_shape(*shapes) -> torch.Size:
    """The broadcast of leading shapes, as ``torch.broadcast_shapes`` gives it. Not that
    function itself: its first call imports sympy (torch's symbolic shapes), a large share of a
    sweep's start-up."""
    return torch.Size(np.broadcast_shapes(*(tuple(s) for s in shapes)))


def _odd(m: int, n: int) -> bool:
    return (m * n) % 2 == 1


def _aligned_empty(batch: int, m: int, n: int) -> torch.Tensor:
    """[batch, m, n] float64 whose matrices each start on a 64-byte boundary."""
    step = -(-(m * n) // 8) * 8  # elements per matrix, a multiple of 64 bytes
    buf = torch.empty(batch * step + 8, dtype=torch.float64)
    off = ((-buf.data_ptr()) % 64) // 8
    return buf[off: off + batch * step].view(batch, step)[:, : m * n].view(batch, m, n)


def matmul64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in float64, batched over broadcast leading dimensions."""
    a, b = a.double(), b.double()
    m, n = a.shape[-2], b.shape[-1]
    if a.device.type != "cpu" or not _odd(m, n) or (a.dim() == 2 and b.dim() == 2):
        return torch.matmul(a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        # bmm into a buffer has no gradient; a gradient's reference does not need the bits of
        # each matrix alone
        return torch.matmul(a, b)
    lead = lead_shape(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
    b3 = b.expand(lead + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
    out = _aligned_empty(a3.shape[0], m, n)
    torch.bmm(a3, b3, out=out)
    return out.reshape(lead + (m, n))


def inv64(x: torch.Tensor) -> torch.Tensor:
    """The inverse of every matrix of ``x`` [..., C, C] in float64, without an error check (so
    without a wait for the GPU): singular matrices give inf/nan entries."""
    x = x.double()
    c = x.shape[-1]
    if x.device.type != "cpu" or not _odd(c, c) or x.dim() == 2:
        return torch.linalg.inv_ex(x).inverse
    flat = x.reshape(-1, c, c)
    # column-major matrices, as LAPACK (and torch's batched call) returns them: reductions over
    # the result then run in the same order as over the per-matrix call's
    out = torch.empty(flat.shape[0], c, c, dtype=torch.float64).transpose(-1, -2)
    for i in range(flat.shape[0]):
        out[i] = torch.linalg.inv_ex(flat[i]).inverse
    return out.reshape(x.shape)  # a view: the batch dimension splits, the layout stays

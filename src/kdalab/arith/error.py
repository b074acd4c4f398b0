"""Error measures, batched over leading dimensions."""

from __future__ import annotations

import math

import torch

__all__ = ["rel_rmse"]


def rel_rmse(actual: torch.Tensor, expected: torch.Tensor, dims: int = 2) -> torch.Tensor:
    """Relative RMS error over the last ``dims`` dimensions, in float64.

    ``sqrt(mean((actual - expected)²)) / (sqrt(mean(expected²)) + 1e-30)``; ``inf`` where
    ``actual`` has any non-finite entry (the seed document's definition). Returns a tensor of the
    leading shape.
    """
    red = tuple(range(-dims, 0))
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(a).flatten(-dims).all(-1) if dims else torch.isfinite(a)
    err = (a - e).square().mean(dim=red).sqrt()
    scale = e.square().mean(dim=red).sqrt()
    out = err / (scale + 1e-30)
    return torch.where(finite, out, torch.full_like(out, math.inf))

"""Input families of the seed document's inverse experiment, generated exactly as the seed does.

For a given seed a family draws from ``torch.Generator(device="cpu").manual_seed(seed)`` in the
seed's order, so kdalab's inputs are bit-identical to the seed code's:

``floor``                  every step at the lower bound (the seed's ``floor_e-5`` for −5);
                           keys ~ N(0, I) normalized, β = sigmoid(N(0, 1)).
``weak_decay_correlated``  one normalized random key repeated, g = −0.01, β = 0.5 (stresses the
                           high powers of L without touching the exponent range).
``model_like``             keys as ``floor``, g = lower_bound · sigmoid(N(0, 1)), then β as
                           ``floor``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith import BF16, torch_cast

__all__ = ["FAMILIES", "USES_LOWER_BOUND", "SEED_CASE_NAMES", "ChunkInputs", "make_inputs",
           "check_family"]

FAMILIES = ("floor", "weak_decay_correlated", "model_like")
USES_LOWER_BOUND = {"floor": True, "weak_decay_correlated": False, "model_like": True}
#: The seed document's names for (family, lower bound −5).
SEED_CASE_NAMES = {"floor": "floor_e-5", "weak_decay_correlated": "weak_decay_correlated",
                   "model_like": "model_like"}
WEAK_LOG_DECAY = -0.01
WEAK_BETA = 0.5


def check_family(family: str) -> str:
    if family not in FAMILIES:
        if family == "floor_e-5":
            return "floor"
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    return family


@dataclass(frozen=True)
class ChunkInputs:
    keys: torch.Tensor  # [..., C, D] bfloat16
    log_decay: torch.Tensor  # [..., C] float64
    beta: torch.Tensor  # [..., C] float64


def make_inputs(family: str, chunk: int, dim: int, seed: int, lower_bound: float = -5.0,
                device: str | torch.device = "cpu") -> ChunkInputs:
    """One chunk's inputs for ``family``, drawn exactly as the seed document's ``make_inputs``."""
    family = check_family(family)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not lower_bound < 0:
        raise ValueError(f"lower_bound must be < 0, got {lower_bound}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    if family == "weak_decay_correlated":
        key = torch.randn(1, dim, dtype=torch.float64, generator=gen)
        key = key / key.norm(dim=-1, keepdim=True)
        keys = key.expand(chunk, -1)
        log_decay = torch.full((chunk,), WEAK_LOG_DECAY, dtype=torch.float64)
        beta = torch.full((chunk,), WEAK_BETA, dtype=torch.float64)
    else:
        keys = torch.randn(chunk, dim, dtype=torch.float64, generator=gen)
        keys = keys / keys.norm(dim=-1, keepdim=True)
        if family == "floor":
            log_decay = torch.full((chunk,), float(lower_bound), dtype=torch.float64)
        else:
            gate = torch.randn(chunk, dtype=torch.float64, generator=gen)
            log_decay = float(lower_bound) * torch.sigmoid(gate)
        beta = torch.sigmoid(torch.randn(chunk, dtype=torch.float64, generator=gen))
    keys = torch_cast(keys, BF16).to(torch.bfloat16)  # the seed's keys.to(bfloat16)
    return ChunkInputs(keys.to(device), log_decay.to(device), beta.to(device))

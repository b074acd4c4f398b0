"""Inverse methods for (I + L)^-1 and the intra-chunk L."""

from __future__ import annotations

import math

import pytest
import torch

from kdalab.kda.intra import kernel_l, stable_l
from kdalab.kda.inverse import (
    exact_inverse,
    forward_substitution,
    neumann_factor_count,
    neumann_inverse,
)
from tests.seed_oracle import seed_neumann  # the seed document's code

pytestmark = pytest.mark.exact  # inverses against the seed's code, bit for bit


def _random_l(batch: int, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    l = torch.randn(batch, c, c, dtype=torch.float64, generator=g) / math.sqrt(c)
    return torch.tril(l, diagonal=-1)


@pytest.mark.parametrize("c", list(range(2, 33)) + [48, 63, 64, 65, 100, 127, 128])
def test_neumann_equals_exact_inverse_in_fp64(c):
    l = _random_l(3, c, seed=c)
    res = neumann_inverse(l, "fp64")
    ref = exact_inverse(l)
    # fp64 products of bounded entries: agreement to a few hundred ulps of the result's scale
    # (entries of (I+L)^-1 grow like the powers of L, up to ~1e3 here).
    scale = ref.abs().amax(dim=(-2, -1), keepdim=True)
    assert ((res.inverse - ref).abs() / scale).max() < 1e-12
    # ⌈log2 C⌉ factors: the highest power formed is the largest 2^j < C
    assert neumann_factor_count(c) == max(1, math.ceil(math.log2(c)))
    assert res.highest_power == 2 ** (neumann_factor_count(c) - 1)


def test_neumann_is_exact_for_nilpotent_integer_matrices():
    # Small integers: every product is exact in fp64, so the identity must hold exactly.
    g = torch.Generator().manual_seed(5)
    for c in (2, 3, 5, 8, 16, 17, 31):
        l = torch.tril(torch.randint(-1, 2, (c, c), generator=g).double(), -1)
        inv = neumann_inverse(l, "fp64").inverse
        assert torch.equal((torch.eye(c, dtype=torch.float64) + l) @ inv,
                           torch.eye(c, dtype=torch.float64))


@pytest.mark.parametrize("c", [2, 7, 16, 33])
def test_forward_substitution_equals_exact(c):
    l = _random_l(2, c, seed=100 + c)
    fs = forward_substitution(l, "fp64")
    ref = exact_inverse(l)
    scale = ref.abs().amax(dim=(-2, -1), keepdim=True)
    assert ((fs - ref).abs() / scale).max() < 1e-12


def test_fp16_neumann_matches_the_seed_loop():
    """neumann_inverse with fp16-seq is the seed's neumann_inverse_fp16, operation for operation."""
    l = (_random_l(1, 16, seed=9)[0] * 0.3).half()
    inv, exponent, max_power = seed_neumann(l)  # the seed's own loop (its CPU fallback)
    res = neumann_inverse(l, "fp16-seq", "fp16")
    assert torch.equal(res.inverse.view(torch.int16), inv.view(torch.int16))
    assert res.highest_power == exponent and res.power_max.item() == max_power


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match="L must be"):
        neumann_inverse(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="chunk"):
        neumann_factor_count(0)
    with pytest.raises(ValueError, match="beta"):
        stable_l(torch.zeros(4, 8), torch.zeros(4), torch.zeros(3))


def test_kernel_l_fp64_recipe_matches_stable_l():
    g = torch.Generator().manual_seed(4)
    keys = torch.randn(5, 16, 32, dtype=torch.float64, generator=g)
    log_decay = -5 * torch.rand(5, 16, dtype=torch.float64, generator=g)
    beta = torch.rand(5, 16, dtype=torch.float64, generator=g)
    ref = stable_l(keys, log_decay, beta)
    for boundary in ("start", "midpoint", "end"):
        got = kernel_l(keys, log_decay, beta, "fp64", boundary).l
        assert (got - ref).abs().max() < 1e-12 * ref.abs().max()


def test_per_channel_decay_stable_l():
    g = torch.Generator().manual_seed(6)
    keys = torch.randn(2, 8, 4, dtype=torch.float64, generator=g)
    gk = -torch.rand(2, 8, 4, dtype=torch.float64, generator=g)
    beta = torch.rand(2, 8, dtype=torch.float64, generator=g)
    l = stable_l(keys, gk, beta)
    G = gk.cumsum(-2)
    i, j = 5, 2
    want = beta[1, i] * (keys[1, i] * keys[1, j] * torch.exp(G[1, i] - G[1, j])).sum()
    assert torch.isclose(l[1, i, j], want, rtol=1e-14, atol=0)

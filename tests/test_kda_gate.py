"""The input stage: gates against fla's torch references, FlashKDA's base-2 gate and L2 norm, and
ValueErrors that name the argument."""

import math
import warnings

import pytest
import torch

from kdalab.arith import exp2_ftz
from kdalab.kda import forward
from kdalab.kda.gate import LOG2E, beta_activation, l2_normalize, log_decay

pytestmark = pytest.mark.exact  # the gates' formulas, bit for bit

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate


def _gate_inputs(h=3, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(2, 5, h, d, generator=gen).bfloat16()
    return g, torch.rand(h, generator=gen), torch.rand(h * d, generator=gen)


@pytest.mark.parametrize("lb", [-1.0, -5.0, -10.0])
def test_lower_bound_gate_equals_fla_fp32(lb):
    g, a_log, dt_bias = _gate_inputs()
    ours = log_decay(g, A_log=a_log, dt_bias=dt_bias, lower_bound=lb, fmt="fp32")
    assert torch.equal(ours, naive_kda_lowerbound_gate(g, a_log, dt_bias, lb))
    no_a = log_decay(g, dt_bias=dt_bias, lower_bound=lb, fmt="fp32")
    assert torch.equal(no_a, naive_kda_lowerbound_gate(g, None, dt_bias, lb))
    ref = log_decay(g, A_log=a_log, dt_bias=dt_bias.view(3, 8), lower_bound=lb)  # [H, K] bias too
    assert ref.dtype == torch.float64 and bool(((ref > lb) & (ref < 0)).all())


def test_unbounded_gate_equals_fla_fp32():
    g, a_log, dt_bias = _gate_inputs()
    ours = log_decay(g, gate="unbounded", A_log=a_log, dt_bias=dt_bias, fmt="fp32")
    assert torch.equal(ours, naive_kda_gate(g, a_log, dt_bias))
    big = log_decay(torch.full((1, 1, 1, 2), 40.0), gate="unbounded")
    assert bool((big < -39).all())  # no lower bound: ~ -softplus(40)


def test_base2_gate_is_flashkda_formula():
    g, a_log, dt_bias = _gate_inputs()
    ours = log_decay(g, A_log=a_log, dt_bias=dt_bias.view(3, 8), lower_bound=-5.0, fmt="fp32",
                     base2=True)
    x = g.float() + dt_bias.view(3, 8)
    a = exp2_ftz(a_log * LOG2E).view(3, 1)
    want = torch.tensor(-5.0 * LOG2E, dtype=torch.float32) * torch.sigmoid(a * x)
    assert torch.equal(ours, want)
    # natural value within float32 rounding of the fp64 gate (|g| <= 5, a few ulps)
    ref = log_decay(g, A_log=a_log, dt_bias=dt_bias, lower_bound=-5.0)
    assert (ours.double() / LOG2E - ref).abs().max() < 1e-5


def test_log_decay_gate_and_beta():
    g = -torch.rand(1, 3, 2, 4, dtype=torch.float64)
    assert torch.equal(log_decay(g, gate="log_decay"), g)
    b = torch.randn(1, 3, 2, dtype=torch.float64)
    assert torch.equal(beta_activation(b), torch.sigmoid(b))
    assert torch.equal(beta_activation(b, is_logits=False), b)


def test_l2_normalize_fp64_and_flashkda_order():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 7, 128, generator=gen).bfloat16()
    ref = l2_normalize(x)
    xd = x.double()
    assert torch.allclose(ref, xd / torch.sqrt(xd.square().sum(-1, keepdim=True) + 1e-6),
                          rtol=1e-15, atol=0)
    # FlashKDA: 16 lanes, each 8 sequential fp32 FMAs, then a butterfly; spelled out here
    xf = x.float()
    lanes = []
    for lane in range(16):
        acc = torch.zeros(4, 7)
        for i in range(8):
            e = xf[..., lane * 8 + i]
            acc = (acc.double() + e.double() * e.double()).float()
        lanes.append(acc)
    part = torch.stack(lanes, -1)
    for off in (8, 4, 2, 1):
        part = part + part[..., torch.arange(16) ^ off]
    want = (xf * torch.rsqrt(part[..., :1] + 1e-6)).bfloat16()
    got = l2_normalize(x, fmt="fp32", lanes=16, out="bf16")
    assert torch.equal(got.bfloat16(), want)
    assert (got.double() - ref).abs().max() < 2 ** -8  # one bf16 rounding of values <= 1


def _args(t=6, h=2, hv=2, d=8):
    gen = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(1, t, h, d, generator=gen), k=torch.randn(1, t, h, d, generator=gen),
                v=torch.randn(1, t, hv, d, generator=gen), g=torch.randn(1, t, h, d, generator=gen),
                beta=torch.randn(1, t, hv, generator=gen))


@pytest.mark.parametrize("change, name", [
    (dict(lower_bound=0.0), "lower_bound"),
    (dict(lower_bound=1.5), "lower_bound"),
    (dict(lower_bound=-math.inf), "lower_bound"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=2.5), "chunk_size"),
    (dict(k=torch.randn(1, 5, 2, 8)), "k"),
    (dict(v=torch.randn(1, 6, 3, 8)), "v"),
    (dict(g=torch.randn(1, 6, 2, 4)), "g"),
    (dict(beta=torch.randn(1, 6)), "beta"),
    (dict(q=torch.ones(1, 6, 2, 8, dtype=torch.int32)), "q"),
    (dict(q=torch.full((1, 6, 2, 8), math.nan)), "q"),
    (dict(v=torch.full((1, 6, 2, 8), math.inf)), "v"),
    (dict(A_log=torch.tensor([0.0, math.nan])), "A_log"),
    (dict(A_log=torch.zeros(3)), "A_log"),
    (dict(dt_bias=torch.zeros(5)), "dt_bias"),
    (dict(cu_seqlens=torch.tensor([0, 4, 3, 6])), "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 2, 5])), "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([1, 6])), "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0.0, 6.0])), "cu_seqlens"),
    (dict(initial_state=torch.zeros(1, 2, 8, 7)), "initial_state"),
    (dict(initial_state=torch.full((1, 2, 8, 8), math.nan)), "initial_state"),
    (dict(gate="softplus"), "gate"),
    (dict(tiles="diagonal"), "tiles"),
    (dict(inverse="lu"), "inverse"),
    (dict(recipe="fp8"), "recipe"),
    (dict(state_layout="KK"), "state_layout"),
    (dict(scale=-1.0), "scale"),
])
def test_bad_input_names_the_argument(change, name):
    args = _args()
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(ValueError, match=name):
        forward(**args, **kwargs)

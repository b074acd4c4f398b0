"""The fp64 recurrent reference: against fla's naive_recurrent_kda, varlen, states, layouts."""

import warnings

import pytest
import torch

from kdalab.arith import rel_rmse
from kdalab.kda import recurrent_kda, reference_forward

pytestmark = pytest.mark.exact  # layouts and packing, bit for bit

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fla.ops.kda.naive import naive_recurrent_kda


def make(b=2, t=33, h=2, hv=4, kd=16, vd=8, seed=0, g_heads=None):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = r(b, t, h, kd)
    k = torch.nn.functional.normalize(r(b, t, h, kd), dim=-1)
    v = r(b, t, hv, vd)
    g = -5 * torch.rand(b, t, g_heads or hv, kd, generator=gen, dtype=torch.float64)
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    h0 = r(b, hv, kd, vd)
    return q, k, v, g, beta, h0


def err(a, b):
    return rel_rmse(a.flatten(), b.flatten(), 1).item()


@pytest.mark.parametrize("hv", [2, 4])
def test_matches_fla_naive(hv):
    q, k, v, g, beta, h0 = make(hv=hv)
    o, s = recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_f, s_f = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float64
    # fla's reference runs in float32 (it casts every input with .to(torch.float)): 33 steps of
    # float32 rounding leave ~1e-7 relative; 1e-5 is a wide margin that still catches any bug.
    assert err(o_f, o) < 1e-5 and err(s_f, s) < 1e-5
    o0, s0 = recurrent_kda(q, k, v, g, beta)
    o0f, _ = naive_recurrent_kda(q, k, v, g, beta)
    assert s0 is None and err(o0f, o0) < 1e-5


def test_gate_per_qk_head_is_broadcast_to_value_heads():
    q, k, v, g, beta, _ = make(hv=4, g_heads=2)
    o, _ = recurrent_kda(q, k, v, g, beta)
    o2, _ = recurrent_kda(q, k, v, g.repeat_interleave(2, dim=2), beta)
    assert torch.equal(o, o2)


def test_varlen_equals_separate_sequences_and_state_layouts():
    q, k, v, g, beta, _ = make(b=1, t=40)
    lens = [7, 16, 17]
    cu = torch.tensor([0, 7, 23, 40])
    h0 = torch.randn(3, 4, 16, 8, dtype=torch.float64)
    o, s = recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                         cu_seqlens=cu)
    start = 0
    for i, n in enumerate(lens):
        sl = slice(start, start + n)
        oi, si = recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                               initial_state=h0[i : i + 1], output_final_state=True)
        # the packed run pads with inert tokens and batches sequences: same operations per row
        assert err(o[:, sl], oi) < 1e-15 and err(s[i : i + 1], si) < 1e-15
        start += n
    o_vk, s_vk = recurrent_kda(q, k, v, g, beta, initial_state=h0.transpose(-1, -2),
                               output_final_state=True, cu_seqlens=cu, state_layout="VK")
    assert torch.equal(o_vk, o) and torch.equal(s_vk, s.transpose(-1, -2))


def test_reference_forward_gate_and_norm():
    q, k, v, g, beta, _ = make(b=1, t=9, hv=2)
    a_log, dt_bias = torch.rand(2, dtype=torch.float64), torch.rand(2, 16, dtype=torch.float64)
    o, _ = reference_forward(q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias, lower_bound=-2.0)
    ld = -2.0 * torch.sigmoid(a_log.exp().view(2, 1) * (g + dt_bias))
    qn = q / torch.sqrt(q.square().sum(-1, keepdim=True) + 1e-6)
    kn = k / torch.sqrt(k.square().sum(-1, keepdim=True) + 1e-6)
    o2, _ = recurrent_kda(qn, kn, v, ld, torch.sigmoid(beta))
    assert err(o, o2) < 1e-14

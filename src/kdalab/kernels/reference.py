"""Token-by-token fp64 twin of ``chunk_kda_fwd``'s contract: the judge for its tests.

Same arguments and conventions (fused gate, L2 norm, β sigmoid, varlen, state layout), no
chunking and no low precision, so any difference is the kernel's rounding or a bug.
Vectorized over batch and heads; a Python loop over tokens (fine on GPU up to T ~ 10^4).
"""

from __future__ import annotations

import torch


def kda_gate(g, A_log=None, dt_bias=None, lower_bound=-5.0):
    """``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` in float64; g is [B, T, H, K]."""
    H, K = g.shape[-2:]
    x = g.to(torch.float64)
    if dt_bias is not None:
        x = x + dt_bias.to(torch.float64).reshape(H, K)
    if A_log is not None:
        x = x * A_log.to(torch.float64).exp()[:, None]
    return lower_bound * torch.sigmoid(x)


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _recurrence(q, k, v, log_decay, beta, S):
    """q, k, log_decay [N, T, H, K]; v [N, T, H, V]; beta [N, T, H]; S [N, H, K, V]."""
    o = torch.empty_like(v)
    for t in range(q.shape[1]):
        S = S * log_decay[:, t].exp()[..., None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("nhk,nhkv->nhv", kt, S))
        S = S + kt[..., None] * u[..., None, :]
        o[:, t] = torch.einsum("nhk,nhkv->nhv", q[:, t], S)
    return o, S


def kda_reference_fp64(q, k, v, g, beta, *, scale=None, initial_state=None,
                       output_final_state=False, A_log=None, dt_bias=None, lower_bound=-5.0,
                       cu_seqlens=None, use_qk_l2norm=True, beta_is_logits=True,
                       state_layout="KV"):
    """Returns (o, final_state) in float64, on the inputs' device."""
    f64 = torch.float64
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * scale
    log_decay = kda_gate(g, A_log, dt_bias, lower_bound)
    beta = beta.to(f64)
    if beta_is_logits:
        beta = torch.sigmoid(beta)
    if cu_seqlens is None:
        bounds = None
        N = B
    else:
        bounds = cu_seqlens.tolist()
        N = len(bounds) - 1
    if initial_state is None:
        S0 = q.new_zeros(N, H, K, V)
    else:
        S0 = initial_state.to(f64)
        if state_layout == "VK":
            S0 = S0.transpose(-1, -2)
    if bounds is None:
        o, S = _recurrence(q, k, v, log_decay, beta, S0)
    else:
        o = torch.empty_like(v)
        states = []
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            oi, Si = _recurrence(q[:, a:b], k[:, a:b], v[:, a:b], log_decay[:, a:b],
                                 beta[:, a:b], S0[i:i + 1])
            o[:, a:b] = oi
            states.append(Si)
        S = torch.cat(states, 0)
    if state_layout == "VK":
        S = S.transpose(-1, -2)
    return o, (S.contiguous() if output_final_state else None)


def rel_err(x, ref):
    """‖x − ref‖ / ‖ref‖ in float64."""
    ref = ref.to(torch.float64)
    return float((x.to(torch.float64) - ref).norm() / ref.norm().clamp_min(1e-300))


FAMILIES = ("model_like", "saturated", "weak_decay_correlated")


def make_inputs(family, B, T, H, K, V=None, *, device="cpu", seed=0, dtype=torch.bfloat16):
    """Kernel inputs (q, k, v, g, beta, A_log, dt_bias) for one input family.

    model_like: random normal q, k, v, raw gate, β logits, A_log, dt_bias.
    saturated: raw gate +20 with A_log = dt_bias = 0, so the log-decay sits at lower_bound.
    weak_decay_correlated: one key per head for all tokens, log-decay -0.01 (for
    lower_bound -5), β = 0.5: the stress case of the Neumann inverse (seed document).
    """
    V = K if V is None else V
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    if family == "model_like":
        g, beta = randn(B, T, H, K), randn(B, T, H)
        A_log, dt_bias = 0.5 * randn(H), 0.5 * randn(H * K)
    elif family == "saturated":
        g, beta = torch.full((B, T, H, K), 20.0, device=device), randn(B, T, H)
        A_log, dt_bias = torch.zeros(H, device=device), torch.zeros(H * K, device=device)
    elif family == "weak_decay_correlated":
        k = randn(1, 1, H, K).expand(B, T, H, K).clone()
        # -5 * sigmoid(x) = -0.01  <=>  x = log(0.002 / 0.998)
        g = torch.full((B, T, H, K), -6.212606095751519, device=device)
        beta = torch.zeros(B, T, H, device=device)
        A_log, dt_bias = torch.zeros(H, device=device), torch.zeros(H * K, device=device)
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return tuple(x.to(dtype) for x in (q, k, v, g, beta)) + (A_log, dt_bias)

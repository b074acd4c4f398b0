"""Contracts: properties of a KDA forward that closeness to fp64 on one call cannot see.

Each contract is a kind of case (:data:`kdalab.check.cases.KINDS`); its record says what was
compared (``contract_compared``) and the largest difference found (``contract_max_diff``).

``causal``        q, k, v, g and β replaced by fresh values at every position t >= P (or,
                  ``perturb="v_beyond_fp16"``, v times 1e5 from P on: past fp16's range, what
                  trips a kernel's fp16 guard; ``"decay_past_split"``, a log-decay of -20 a
                  step from P on: P's chunk then spans past a split exponent's range, what
                  sends a chunk down a per-pair path): the outputs before P must keep every
                  bit (P at a chunk boundary, and inside a chunk), and every output be
                  finite. A failure names the first position that changed.
``prefill``       [0, P) then [P, T) with the first call's final state carried into the second,
                  against the fp64 recurrence on [0, T): within the budget of the floor, as an
                  accuracy case (P chunk-aligned, and not). The largest difference from one call
                  on [0, T) is recorded.
``batch_varlen``  the same sequences as a batch (B = 3), packed (varlen, B = 1) and one call per
                  sequence: each within the budget of the floor against fp64; the largest
                  difference between the three is recorded (a leak across sequences is far
                  above the floor).
``layout``        where a kernel takes states both as ``[N, H, K, V]`` and ``[N, H, V, K]``
                  (its adapter's ``other_layout``): the output and the final state (transposed
                  back) must keep every bit. A kernel with one layout: unsupported.
``decode``        decode = prefill: the case's sequences decoded one token a step (the last
                  four tokens in one step of T_new = 4) through the kernel's decode function
                  (its adapter's ``decode``) on a state pool, each sequence at a row of its own
                  among rows no index names; the decoded outputs and final states against fp64
                  on [0, T) within the budget of the floor, as an accuracy case, and the rows no
                  index names bit for bit. The largest difference from one prefill call on
                  [0, T) is recorded. A kernel without a decode function: unsupported.

**Gradients** (``kdalab check --grad``; the field ``grad_contract_max_diff``): three contracts
also judge the kernel's backward, with the upstream gradients of
:func:`~kdalab.check.gradients.upstream` (the case's seed).

``causal``        both directions of a backward's causality, to the bit. The upstream dO before
                  P replaced by fresh values (``v_beyond_fp16``: times 1e5): the per-token
                  gradients (dq, dk, dv, dg, dβ) at t >= P keep every bit. The case's own
                  change of the inputs at t >= P, with dO zero from P on and no gradient into
                  the final state: every gradient of the tokens before P, dh0 and the summed
                  dA_log and ddt_bias keep every bit (a loss of outputs before P cannot see
                  later tokens; an overflow after P must not reach earlier gradients).
``batch_varlen``  the gradients of the three forms (dA_log and ddt_bias summed over the
                  separate calls) each within the budget of their floors against the fp64
                  reference's, as an accuracy case's.
``layout``        every gradient the same bits in the other state layout (dh0 in ``[N, H, K,
                  V]`` for both).

``prefill`` and ``decode`` judge the forward only.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from kdalab.check.budget import judge_errors
from kdalab.check.calls import Raised, call, max_diff, nonfinite, rel, same
from kdalab.check.cases import CaseInputs
from kdalab.check.gradients import PER_TOKEN, SUMMED, upstream

__all__ = ["CONTRACT_FIELDS", "BEYOND_FP16", "judge_contract", "time_slice"]

CONTRACT_FIELDS = ("contract_compared", "contract_max_diff")


def time_slice(x: CaseInputs, start: int, stop: int, initial_state) -> CaseInputs:
    """Tokens ``[start, stop)`` of a fixed-length case, starting from ``initial_state``."""
    def cut(t):
        return t[:, start:stop].contiguous()

    return replace(x, q=cut(x.q), k=cut(x.k), v=cut(x.v), g=cut(x.g), beta=cut(x.beta),
                   initial_state=initial_state, rows=x.rows[:, start:stop])


#: v's factor from the split on in a ``v_beyond_fp16`` causal case (issue 41's: bf16 v ~ N(0, 1)
#: becomes ~1e5, past fp16's 65504, and so does the state it writes)
BEYOND_FP16 = 1e5


#: the log-decay a step from the split on in a ``decay_past_split`` causal case: 16 steps of
#: it span 320, past a split exponent's float32 range (80), from any row of a 16-token chunk
#: but its last four
STRONG_DECAY = 20.0


def _perturbed(x: CaseInputs, split: int, seed: int, perturb: str) -> CaseInputs:
    """``x`` changed from ``split`` on: fresh N(0, 1) values of q, k, v, g and β (a log-decay
    g as −|N(0, 1)|, a log-decay being <= 0), v times :data:`BEYOND_FP16`, or the gate set to
    a log-decay of −:data:`STRONG_DECAY` a step (the unbounded gate's raw input through its
    softplus, which is its argument there: exp(A_log)·(g + dt_bias) = 20)."""
    if perturb == "decay_past_split":
        g = x.g.clone()
        if x.gate == "log_decay":
            g[:, split:] = -STRONG_DECAY
        else:
            raw = STRONG_DECAY / x.A_log.double().exp()[:, None] - x.dt_bias.double()
            g[:, split:] = raw.to(g.dtype)
        return replace(x, g=g)
    if perturb == "v_beyond_fp16":
        v = x.v.clone()
        v[:, split:] = (v[:, split:].double() * BEYOND_FP16).to(v.dtype)
        return replace(x, v=v)
    gen = torch.Generator().manual_seed(seed)
    changed = {}
    for name in ("q", "k", "v", "g", "beta"):
        t = getattr(x, name).clone()
        fresh = torch.randn(t[:, split:].shape, generator=gen)
        if name == "g" and x.gate == "log_decay":
            fresh = -fresh.abs()
        t[:, split:] = fresh.to(dtype=t.dtype, device=t.device)
        changed[name] = t
    return replace(x, **changed)


def _first_change(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where ``a`` and ``b`` (``[B, T, H, ...]``) first differ in any bit: the earliest time
    position, in the first sequence and head that differ there."""
    from kdalab.check.calls import bits_equal

    differs = ~bits_equal(a, b).reshape(a.shape[0], a.shape[1], a.shape[2], -1).all(-1)
    t = int(differs.any(2).any(0).nonzero()[0, 0])
    seq, head = (int(i) for i in differs[:, t].nonzero()[0])
    return f"t = {t}, sequence {seq}, head {head}"


def _causal(kernel, x, case):
    p = case.split
    (o, _), _ = call(kernel, x, case.name)
    (again, _), _ = call(kernel, x, case.name)
    (o_p, _), _ = call(kernel, _perturbed(x, p, case.seed + 1, case.perturb), case.name)
    changed = {"v_beyond_fp16": f"v times {BEYOND_FP16:g}",
               "decay_past_split": f"a log-decay of -{STRONG_DECAY:g} a step"}.get(
                   case.perturb, "q, k, v, g, beta changed")
    rec = {"contract_compared": f"o[:, :{p}] with {changed} at t >= {p} against o[:, :{p}] "
                                f"unchanged (bit-identical)",
           "contract_max_diff": max_diff(o_p[:, :p], o[:, :p]), "o_dtype": str(o.dtype)[6:],
           "o_nonfinite": nonfinite(o) + nonfinite(o_p), "deterministic": same(o, again)}
    failures = []
    if rec["o_nonfinite"]:
        failures.append("causal: non-finite output from finite inputs")
    if not rec["deterministic"]:
        failures.append("two calls on the same inputs gave different bits (causality not "
                        "judged)")
    elif not same(o_p[:, :p], o[:, :p]):
        where = _first_change(o_p[:, :p], o[:, :p])
        failures.append(f"causal: outputs before t = {p} changed when later inputs did (first "
                        f"at {where}, largest difference {rec['contract_max_diff']:.3g})")
    return rec, failures


def _prefill(kernel, x, case, ref, floors, th):
    p, t = case.split, x.q.shape[1]
    (o1, s1), _ = call(kernel, time_slice(x, 0, p, x.initial_state), case.name)
    carried = s1.float().contiguous()
    (o2, s2), _ = call(kernel, time_slice(x, p, t, carried), case.name)
    (o, s), _ = call(kernel, x, case.name)
    split = torch.cat([o1, o2], dim=1)
    rec = {"o_rel_err": rel(split, ref[0]), "state_rel_err": rel(s2, ref[1]),
           "o_nonfinite": nonfinite(split), "state_nonfinite": nonfinite(s2),
           "o_dtype": str(split.dtype)[6:], "state_dtype": str(s2.dtype)[6:],
           "contract_compared": f"[0, {p}) then [{p}, {t}) with the final state carried, "
                                f"against fp64 on [0, {t}) (budget); max diff against one call",
           "contract_max_diff": max(max_diff(split, o), max_diff(s2, s))}
    return _budget(rec, floors, split.dtype, th, "prefill")


def _batch_varlen(kernel, x, case, ref, floors, th):
    b, t = x.q.shape[:2]

    def flat(u):
        return u.reshape(1, b * t, *u.shape[2:]).contiguous()

    cu = torch.arange(0, (b + 1) * t, t, dtype=torch.int64, device=x.q.device)
    packed = replace(x, q=flat(x.q), k=flat(x.k), v=flat(x.v), g=flat(x.g), beta=flat(x.beta),
                     cu_seqlens=cu, rows=x.rows.reshape(1, b * t))
    answers, notes, forms = {"batch": call(kernel, x, case.name)[0]}, [], {"separate": []}
    if kernel.unsupported(packed) is None:
        forms["varlen"] = packed
        o, s = call(kernel, packed, case.name)[0]
        answers["varlen"] = (o.reshape(b, t, *o.shape[2:]), s)
    else:
        notes.append("varlen declared unsupported")
    outs, states = [], []
    for i in range(b):
        one = replace(x, q=x.q[i:i + 1], k=x.k[i:i + 1], v=x.v[i:i + 1], g=x.g[i:i + 1],
                      beta=x.beta[i:i + 1], rows=x.rows[i:i + 1],
                      initial_state=None if x.initial_state is None else x.initial_state[i:i + 1])
        o, s = call(kernel, one, case.name)[0]
        forms["separate"].append(one)
        outs.append(o)
        states.append(s)
    answers["separate"] = (torch.cat(outs), torch.cat(states))
    o_errs = [rel(o, ref[0]) for o, _ in answers.values()]
    s_errs = [rel(s, ref[1]) for _, s in answers.values()]
    ob, sb = answers["batch"]
    rec = {"o_rel_err": max(o_errs, key=_worst), "state_rel_err": max(s_errs, key=_worst),
           "o_nonfinite": sum(nonfinite(o) for o, _ in answers.values()),
           "state_nonfinite": sum(nonfinite(s) for _, s in answers.values()),
           "o_dtype": str(ob.dtype)[6:], "state_dtype": str(sb.dtype)[6:],
           "contract_compared": f"{b} sequences as {', '.join(answers)} against fp64 (budget, "
                                f"the worst of them); max diff between them"
                                + (f" ({'; '.join(notes)})" if notes else ""),
           "contract_max_diff": max(max(max_diff(o, ob), max_diff(s, sb))
                                    for o, s in answers.values())}
    return _budget(rec, floors, ob.dtype, th, "batch = varlen = separate"), forms


def _worst(err: float) -> float:
    return math.inf if math.isnan(err) else err


def _budget(rec, floors, out_dtype, th, name):
    failures = []
    if rec["o_nonfinite"] or rec["state_nonfinite"]:
        failures.append(f"{name}: non-finite output or state")
    rec.update(floors.of(out_dtype))
    fields, over = judge_errors(rec["o_rel_err"], rec["state_rel_err"], rec, th)
    rec.update(fields)
    return rec, failures + [f"{name}: {m}" for m in over]


def _layout(kernel, x, case):
    other = kernel.in_other_layout()
    if other is None:
        raise Raised(NotImplementedError("takes states in one layout (no other_layout)"))
    (o, s), _ = call(kernel, x, case.name)
    (o2, s2), _ = call(other, x, case.name)
    rec = {"contract_compared": f"o and final state with states {kernel.state_layout} against "
                                f"{other.state_layout} (transposed back): bit-identical",
           "contract_max_diff": max(max_diff(o2, o), max_diff(s2, s)),
           "o_dtype": str(o.dtype)[6:], "state_dtype": str(s.dtype)[6:]}
    ok = same(o, o2) and same(s, s2)
    return rec, [] if ok else [f"layout: the other state layout changed the result (largest "
                               f"difference {rec['contract_max_diff']:.3g})"]


class _DecodeStep:
    """One decode step on ``pool`` at rows ``indices``, shaped as :func:`call` runs a kernel
    (``x`` in, ``(o, pool)`` out), so a step's errors, device faults and modified inputs are
    handled as a call's."""

    def __init__(self, kernel, pool, indices):
        self.name, self._kernel, self._pool, self._indices = kernel.name, kernel, pool, indices

    def __call__(self, x: CaseInputs):
        return self._kernel.decode_step(x, self._pool, self._indices), self._pool


def _kv(states, kernel):
    """Pool rows between ``[P, H, K, V]`` and the kernel's layout (a transpose is its own
    inverse)."""
    return states.transpose(-1, -2) if kernel.state_layout == "VK" else states


#: tokens of the one multi-token decode step at the end (speculative decoding's shape)
DECODE_TAIL = 4


def _decode(kernel, x, case, ref, floors, th):
    if kernel.decode is None:
        raise Raised(NotImplementedError("declared: no decode function (KernelAdapter.decode)"))
    n, t, h, kd = x.q.shape
    vd = x.v.shape[-1]
    (o_pre, s_pre), _ = call(kernel, x, case.name)
    # each sequence at an odd row, in reverse order; the even rows hold values no step may touch
    rows = 2 * n + 1
    idx = torch.arange(2 * n - 1, 0, -2, dtype=torch.int64, device=x.q.device)
    gen = torch.Generator().manual_seed(case.seed + 2)
    states = torch.randn(rows, h, kd, vd, generator=gen).to(x.q.device)
    states[idx] = (torch.zeros(n, h, kd, vd, device=x.q.device) if x.initial_state is None
                   else x.initial_state.float())
    pool = _kv(states, kernel).contiguous()  # in the kernel's layout
    before = states.clone()
    tail = DECODE_TAIL if t >= 2 * DECODE_TAIL else 1
    steps = [(i, i + 1) for i in range(t - tail)] + [(t - tail, t)]
    step, outs, modified = _DecodeStep(kernel, pool, idx), [], set()
    for a, b in steps:
        (o, _), mod = call(step, time_slice(x, a, b, None), case.name)
        outs.append(o)
        modified.update(mod)
    o_dec = torch.cat(outs, dim=1)
    after = _kv(pool, kernel)
    s_dec = after[idx]
    others = torch.ones(rows, dtype=torch.bool, device=x.q.device)
    others[idx] = False
    rec = {"o_rel_err": rel(o_dec, ref[0]), "state_rel_err": rel(s_dec, ref[1]),
           "o_nonfinite": nonfinite(o_dec), "state_nonfinite": nonfinite(s_dec),
           "o_dtype": str(o_dec.dtype)[6:], "state_dtype": str(s_dec.dtype)[6:],
           "contract_compared": f"{len(steps)} decode steps ({t - tail} of 1 token, then one "
                                f"of {tail}) through pool rows {idx.tolist()} of {rows}, "
                                f"against fp64 on [0, {t}) (budget); the other rows bit for "
                                f"bit; max diff against one prefill call",
           "contract_max_diff": max(max_diff(o_dec, o_pre), max_diff(s_dec, s_pre))}
    rec, failures = _budget(rec, floors, o_dec.dtype, th, "decode")
    if not same(after[others], before[others]):
        failures.append("decode: pool rows no index names changed")
    if modified:
        failures.append(f"decode: modified its inputs: {', '.join(sorted(modified))}")
    return rec, failures


# -- the backward's contracts (the module's **Gradients**) ----------------------------------------

def _grads(kernel, x, case, do, dht) -> dict[str, torch.Tensor]:
    return call(kernel, x, case.name, (do, dht))[0][2]


def _differing(a: dict, b: dict, cut: dict) -> tuple[float, list[str]]:
    """The largest difference between gradients ``a`` and ``b`` over ``cut`` (name: the
    index of the values compared) and the names that differ in any bit."""
    pairs = {n: (a[n][i], b[n][i]) for n, i in cut.items() if n in a}
    return (max((max_diff(u, w) for u, w in pairs.values()), default=0.0),
            [n for n, (u, w) in pairs.items() if not same(u, w)])


def _upstream_before(do: torch.Tensor, split: int, seed: int, perturb: str) -> torch.Tensor:
    """``do`` changed before ``split``: fresh N(0, 1) values rounded to bf16, or (the
    ``v_beyond_fp16`` case) times :data:`BEYOND_FP16`."""
    d = do.clone()
    if perturb == "v_beyond_fp16":
        d[:, :split] *= BEYOND_FP16
    else:
        gen = torch.Generator().manual_seed(seed)
        d[:, :split] = torch.randn(d[:, :split].shape, generator=gen).bfloat16().to(d)
    return d


def _causal_grad(kernel, x, case):
    p, (do, dht) = case.split, upstream(x, case.seed)
    first = _grads(kernel, x, case, do, dht)
    again = _grads(kernel, x, case, do, dht)
    later = _grads(kernel, x, case, _upstream_before(do, p, case.seed + 3, case.perturb), dht)
    do_past = do.clone()
    do_past[:, p:] = 0
    no_future = (do_past, torch.zeros_like(dht))
    past = _grads(kernel, x, case, *no_future)
    past_changed = _grads(kernel, _perturbed(x, p, case.seed + 1, case.perturb), case,
                          *no_future)
    after, before = slice(p, None), slice(None, p)
    d1, n1 = _differing(first, later, {n: (slice(None), after) for n in PER_TOKEN})
    d2, n2 = _differing(past, past_changed, {**{n: (slice(None), before) for n in PER_TOKEN},
                                             **{n: ... for n in ("dh0", *SUMMED)}})
    runs = (first, again, later, past, past_changed)
    rec = {"grad_contract_max_diff": max(d1, d2),
           "grad_deterministic": all(same(g, again[n]) for n, g in first.items()),
           "grad_nonfinite": sum(nonfinite(g) for r in runs for g in r.values())}
    compared = (f"; gradients at t >= {p} with dO changed before {p}, and before {p} (dh0, "
                f"the sums) with dO zero from {p} on and the inputs changed there "
                f"(bit-identical)")
    failures = ["causal: non-finite gradient"] if rec["grad_nonfinite"] else []
    if not rec["grad_deterministic"]:
        failures.append("two calls gave different gradient bits (the gradients' causality not "
                        "judged)")
        return rec, compared, failures
    if n1:
        failures.append(f"causal: gradients at t >= {p} changed when the upstream gradient "
                        f"before {p} did ({', '.join(n1)}; largest difference {d1:.3g})")
    if n2:
        failures.append(f"causal: gradients before t = {p} changed when later inputs did, "
                        f"with no gradient from t >= {p} ({', '.join(n2)}; largest difference "
                        f"{d2:.3g})")
    return rec, compared, failures


def _layout_grad(kernel, x, case):
    do, dht = upstream(x, case.seed)
    a = _grads(kernel, x, case, do, dht)
    b = _grads(kernel.in_other_layout(), x, case, do, dht)
    diff, names = _differing(a, b, dict.fromkeys(a, ...))
    rec = {"grad_contract_max_diff": diff,
           "grad_nonfinite": sum(nonfinite(g) for g in (*a.values(), *b.values()))}
    failures = ["layout: non-finite gradient"] if rec["grad_nonfinite"] else []
    if names:
        failures.append(f"layout: the other state layout changed the gradients "
                        f"({', '.join(names)}; largest difference {diff:.3g})")
    return rec, "; the gradients, every one bit-identical", failures


def _batch_varlen_grad(kernel, x, case, forms, grads, th):
    """``forms``: the batch, and where run the packed (varlen) and separate calls' inputs."""
    do, dht = upstream(x, case.seed)
    b, t = x.q.shape[:2]
    got = {"batch": _grads(kernel, x, case, do, dht)}
    if "varlen" in forms:
        g = _grads(kernel, forms["varlen"], case, do.reshape(1, b * t, *do.shape[2:]), dht)
        got["varlen"] = {n: u.reshape(b, t, *u.shape[2:]) if n in PER_TOKEN else u
                         for n, u in g.items()}
    parts = [_grads(kernel, one, case, do[i:i + 1], dht[i:i + 1])
             for i, one in enumerate(forms["separate"])]
    got["separate"] = {n: (sum(r[n] for r in parts) if n in SUMMED
                           else torch.cat([r[n] for r in parts])) for n in parts[0]}
    judged = {form: grads.judge(g, th) for form, g in got.items()}
    worst = max(judged, key=lambda f: max((v for k, v in judged[f][0].items()
                                           if k.endswith("_budget_multiple")
                                           and v is not None and not math.isnan(v)),
                                          default=0.0))
    rec = {**judged[worst][0], "grad_nonfinite": sum(j[0]["grad_nonfinite"]
                                                     for j in judged.values()),
           "grad_contract_max_diff": max(_differing(g, got["batch"], dict.fromkeys(g, ...))[0]
                                         for g in got.values())}
    failures = [f"batch = varlen = separate ({form} gradients): {m}"
                for form, (_, over) in judged.items() for m in over]
    return rec, (f"; gradients of each form against fp64 (budget, the worst: {worst}); max "
                 f"diff between them"), failures


def judge_contract(kernel, x: CaseInputs, case, ref, floors, th,
                   grads=None) -> tuple[dict, list[str]]:
    """One contract case: ``(record fields, failures)``; raises
    :class:`~kdalab.check.calls.Raised` if the kernel raises (NotImplementedError for a
    contract the kernel cannot take). Under ``th.grad`` the causal, batch_varlen and layout
    contracts judge the backward too (``grads``: batch_varlen's
    :class:`~kdalab.check.gradients.GradientCheck`)."""
    if case.kind == "layout":
        rec, failures = _layout(kernel, x, case)
        extra = _layout_grad(kernel, x, case) if th.grad else None
    elif case.kind == "causal":
        rec, failures = _causal(kernel, x, case)
        extra = _causal_grad(kernel, x, case) if th.grad else None
    elif case.kind == "prefill":
        return _prefill(kernel, x, case, ref, floors, th)
    elif case.kind == "decode":
        return _decode(kernel, x, case, ref, floors, th)
    else:
        (rec, failures), forms = _batch_varlen(kernel, x, case, ref, floors, th)
        extra = _batch_varlen_grad(kernel, x, case, forms, grads, th) if th.grad else None
    if extra is not None:
        fields, compared, more = extra
        rec.update(fields)
        rec["contract_compared"] += compared
        failures = failures + more
    return rec, failures

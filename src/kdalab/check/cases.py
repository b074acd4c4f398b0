"""The check's cases: data, not code paths. A case is a family × a shape × options; a suite is a
tuple of cases; one function draws any case's inputs and one computes its fp64 reference.

Families: the presets ``model_like``, ``saturated``, ``weak_decay_correlated``, ``collinear``,
``strong_decay``, ``strongest_decay`` and ``mixed_decay`` of :mod:`kdalab.inputs.sequences`
(bf16 inputs as a model hands them to a kernel; β as logits), at the case's shape and options
(:func:`case_spec`); a collinear case's ``key_noise`` is the preset's ``key_eps`` (0 gives
identical keys).

Gates (``gate``, one of :data:`kdalab.kda.GATES`): ``lower_bound`` (g the raw gate input,
``lower_bound·sigmoid(exp(A_log)·(g + dt_bias))``), ``unbounded`` (fla's softplus gate
``−exp(A_log)·softplus(g + dt_bias)``, ``lower_bound`` None) or ``log_decay`` (g the log-decay
itself in ``g_dtype``, computed from the family's gate in fp64; ``lower_bound`` the promise that no
step decays below it, or None). Kernels that do not take a mode declare it (their adapter).

Kinds: ``accuracy`` (one call against the fp64 recurrence) or a contract
(:mod:`kdalab.check.contracts`): ``causal``, ``prefill``, ``batch_varlen``, ``layout``,
``decode``;
``split`` is the position P a contract splits at; ``perturb`` what a causal contract writes from
P on (``fresh`` inputs; ``v_beyond_fp16``: v times 1e5; ``decay_past_split``: a log-decay of
-20 a step, for the unbounded and log-decay gates). ``source`` names a safetensors file of
captured inputs (:mod:`kdalab.check.replay`): the case's tensors are read from it instead of
drawn.

Groups (by name): ``unbounded/*`` fla's softplus gate on model-like and hard inputs (one at −20
per step: a 16-token chunk spans ~320 in log space, past a split exponent's float32 range);
``strong_decay/*`` log-decay down to −20 per step and mixtures of strong and weak channels, as
a raw unbounded gate and as a log-decay; ``log_decay/*`` a precomputed log-decay of ordinary
decay, with the bound as a promise and without.

Options: the lower bound; the initial state (none, fp32 or bf16, N(0, 1) times ``state_scale``);
``v_scale`` (a power of two, so bf16 v stays exact); pre-normalized q and k with the kernel's
normalization off; ``poison``: a NaN or inf written into one token of the last sequence. A poisoned
case is judged on the other sequences only (they must come out clean and right); what the
poisoned sequence gives is recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from fnmatch import fnmatchcase

import torch

from kdalab import params
from kdalab.check.tensors import CaseInputs, read_inputs
from kdalab.inputs.sequences import LOG_DECAY_DTYPES, STATES, SequenceSpec, draw, preset
from kdalab.kda import GATES, reference_forward

__all__ = ["FAMILIES", "KINDS", "POISONS", "PERTURBS", "GATES", "STATES", "Case", "CaseInputs",
           "SUITES", "get_suite", "select_cases", "case_spec", "case_inputs", "reference",
           "recurrence"]

FAMILIES = ("model_like", "saturated", "weak_decay_correlated", "collinear", "strong_decay",
            "strongest_decay", "mixed_decay")
KINDS = ("accuracy", "causal", "prefill", "batch_varlen", "layout", "decode")
POISONS = ("", "nan_v", "inf_k")
#: what a causal contract writes from its split on: fresh N(0, 1) inputs, or v times 1e5
PERTURBS = ("fresh", "v_beyond_fp16", "decay_past_split")


@dataclass(frozen=True)
class Case:
    """One input configuration. ``T`` is the length of each of ``batch`` sequences, or, with
    ``seqlens``, the sequences are packed along T (B = 1, ``cu_seqlens``; zero lengths allowed)."""

    name: str
    family: str = "model_like"
    T: int = 2048
    batch: int = 1
    seqlens: tuple[int, ...] | None = None
    heads: int = 4
    K: int = 128
    V: int = 128
    gate: str = "lower_bound"
    lower_bound: float | None = -5.0
    g_dtype: str = "bf16"
    initial_state: str = "fp32"
    state_scale: float = 1.0
    v_scale: float = 1.0
    prenormalized: bool = False
    poison: str = ""
    key_noise: float = 0.0
    kind: str = "accuracy"
    split: int = 0
    perturb: str = "fresh"
    source: str = ""
    seed: int = 0
    about: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        def bad(name, what):
            raise ValueError(f"case {self.name!r}: {name} {what}, got {getattr(self, name)!r}")

        if not self.name or any(c in self.name for c in ", \t\n"):
            raise ValueError(f"case name must be non-empty without commas or spaces, "
                             f"got {self.name!r}")
        if self.family not in FAMILIES:
            bad("family", f"must be one of {', '.join(FAMILIES)}")
        if self.initial_state not in STATES:
            bad("initial_state", f"must be one of {', '.join(STATES)}")
        if self.kind not in KINDS:
            bad("kind", f"must be one of {', '.join(KINDS)}")
        if self.kind in ("causal", "prefill") and not 0 < self.split < self.T:
            bad("split", "must lie in (0, T) for a causal or prefill contract")
        if self.kind != "accuracy" and (self.seqlens is not None or self.poison):
            bad("kind", "contracts take fixed-length, clean sequences")
        if not (math.isfinite(self.key_noise) and self.key_noise >= 0):
            bad("key_noise", "must be a finite number >= 0")
        if self.poison not in POISONS:
            bad("poison", f"must be one of {', '.join(p or repr(p) for p in POISONS)}")
        for name in ("T", "batch", "heads", "K", "V"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.gate not in GATES:
            bad("gate", f"must be one of {', '.join(GATES)}")
        if self.gate == "unbounded":
            if self.lower_bound is not None:
                bad("lower_bound", "must be None for the unbounded gate")
        elif not (self.gate == "log_decay" and self.lower_bound is None):
            # the one parse of a lower bound (kdalab.params)
            object.__setattr__(self, "lower_bound",
                               params.lower_bound(self.lower_bound, f"case {self.name!r}: "
                                                                    "lower_bound"))
        if self.g_dtype not in LOG_DECAY_DTYPES or (self.gate != "log_decay" and not self.source
                                                    and self.g_dtype != "bf16"):
            bad("g_dtype", "must be bf16 (a drawn raw gate input), or fp32 or bf16 (a log-decay "
                "or a captured file's)")
        if self.perturb not in PERTURBS or (self.kind != "causal" and self.perturb != "fresh"):
            bad("perturb", f"must be one of {', '.join(PERTURBS)} (a causal contract's; "
                "fresh for the other kinds)")
        if self.perturb == "decay_past_split" and (self.gate == "lower_bound" or self.source):
            bad("perturb", "decay_past_split takes the unbounded or log-decay gate of a drawn "
                "case (a bounded gate cannot decay past the split's range)")
        for name in ("state_scale", "v_scale"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                bad(name, "must be a finite number > 0")
        if self.seqlens is not None:
            if self.batch != 1:
                bad("batch", "must be 1 with seqlens (sequences packed along T)")
            if not self.seqlens or any(n < 0 for n in self.seqlens) or sum(self.seqlens) < 1:
                bad("seqlens", "must be lengths >= 0 with at least one token")
            if self.T != sum(self.seqlens):
                object.__setattr__(self, "T", sum(self.seqlens))
            if self.poison and self.seqlens[-1] < 1:
                bad("seqlens", "must end with a non-empty sequence for a poisoned case")
        if self.poison and self.sequences < 2:
            bad("poison", "needs two sequences or more (the clean ones are judged)")

    @property
    def sequences(self) -> int:
        return len(self.seqlens) if self.seqlens is not None else self.batch

    def describe(self) -> dict:
        """The case's parameters as flat record fields."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("name", "about", "seqlens")}
        out["seqlens"] = "" if self.seqlens is None else ",".join(map(str, self.seqlens))
        return out


def _suite(base: Case, *, long_T: int, range_T: int, dims: tuple[tuple[int, int], ...],
           varlen: tuple[tuple[str, tuple[int, ...]], ...], poison_T: int,
           poison_seqlens: tuple[int, ...] | None, lengths: tuple[int, ...],
           collinear_T: int, contract_T: int, splits: tuple[int, int],
           batch_T: int, decode_T: int, long_causal_T: int = 0,
           long_split: int = 0) -> tuple[Case, ...]:
    def case(name, about, **changes):
        return replace(base, name=name, about=about, **changes)

    cases = [
        case("model_like", "ordinary inputs, random fp32 initial state"),
        case("saturated", "the gate at its lower bound at every step", family="saturated"),
        case("weak_decay_correlated", "one key repeated, decay -0.01 per step: high powers "
             "of L", family="weak_decay_correlated"),
        case("no_h0", "ordinary inputs, no initial state", initial_state="none"),
        case("lb/-2", "lower bound -2", lower_bound=-2.0),
        case("lb/-0.5", "lower bound -0.5", lower_bound=-0.5),
    ]
    cases += [case(f"T/{t}", f"T = {t}", T=t) for t in lengths]
    if long_T:
        cases.append(case("T/long", f"a long sequence, T = {long_T}", T=long_T))
    cases += [case(f"varlen/{name}", f"packed sequences of lengths {list(lens)}", seqlens=lens)
              for name, lens in varlen]
    cases += [
        case("batch/2", "two fixed-length sequences", batch=2, T=range_T),
        case("v/beyond_fp16", "v scaled by 2^17: entries up to ~2^19, past fp16's 65504",
             T=range_T, v_scale=2.0**17),
        case("h0/beyond_fp16", "initial state N(0, 1)·2^17, past fp16's range", T=range_T,
             state_scale=2.0**17),
        case("h0/bf16", "a bf16 initial state (and final state)", initial_state="bf16"),
    ]
    cases += [case(f"dims/{k}x{v}", f"K = {k}, V = {v}", K=k, V=v, T=range_T) for k, v in dims]
    cases += [
        case("prenorm", "q, k L2-normalized by the caller, the kernel's normalization off",
             prenormalized=True),
        case("nonfinite/nan_v", "NaN in v of the second sequence: the first must stay right",
             batch=2, T=poison_T, poison="nan_v"),
        case("nonfinite/inf_k", "inf in k of the second sequence: the first must stay right",
             batch=2, T=poison_T, poison="inf_k"),
    ]
    if poison_seqlens is not None:
        cases.append(case("nonfinite/nan_varlen", "NaN in the last packed sequence: the others "
                          "must stay right", seqlens=poison_seqlens, poison="nan_v"))
    cases += [case(f"collinear/eps{eps:g}", f"one shared key + {eps:g}·noise, beta -> 1, "
                   f"decay ~ 1, T = {collinear_T}", family="collinear", key_noise=eps,
                   T=collinear_T) for eps in (0.0, 0.02, 0.05)]
    boundary, inside = splits
    cases += [
        case("contract/causal/boundary", f"inputs changed at t >= {boundary} (a chunk "
             f"boundary): outputs before it bit-identical", kind="causal", T=contract_T,
             split=boundary),
        case("contract/causal/inside", f"inputs changed at t >= {inside} (inside a chunk): "
             f"outputs before it bit-identical", kind="causal", T=contract_T, split=inside),
        # the last token of a partly filled last chunk: fla's safe_gate path anchored its
        # exponentials on a row that is the last valid token there (fla issue #1240)
        case("contract/causal/tail", f"the last token changed, T = {contract_T + 6} (a partly "
             f"filled last chunk): outputs before it bit-identical", kind="causal",
             T=contract_T + 6, split=contract_T + 5),
        case("contract/prefill/aligned", f"[0, {boundary}) then [{boundary}, T) with the state "
             f"carried, against the fp64 reference", kind="prefill", T=contract_T,
             split=boundary),
        case("contract/prefill/unaligned", f"[0, {inside}) then [{inside}, T) with the state "
             f"carried, against the fp64 reference", kind="prefill", T=contract_T,
             split=inside),
        case("contract/batch_varlen", "three sequences as B = 3, as varlen and one by one",
             kind="batch_varlen", batch=3, T=batch_T),
        case("contract/layout", "states in [N, H, K, V] and in [N, H, V, K], where a kernel "
             "takes both: the same bits", kind="layout", T=contract_T),
        case("contract/decode", "two sequences decoded one token a step (the last four in "
             "one step) through a state pool, against the fp64 reference; the difference from "
             "one prefill call recorded", kind="decode", batch=2, T=decode_T),
        # the fp16 guard's trigger: a guard that recomputes more than the overflowing part
        # changes outputs before P (issue 41: from token 0, or from P's segment's start)
        case("contract/causal/fp16_guard", f"v times 1e5 at t >= {inside} (past fp16's range: "
             f"trips an fp16 guard): outputs before it bit-identical", kind="causal",
             T=contract_T, split=inside, perturb="v_beyond_fp16"),
    ]
    if long_causal_T:
        cases.append(case("contract/causal/fp16_guard_long", f"v times 1e5 at t >= "
                          f"{long_split}, T = {long_causal_T} (a sequence-parallel path's "
                          f"segments): outputs before it bit-identical", kind="causal",
                          T=long_causal_T, split=long_split, perturb="v_beyond_fp16"))
    return tuple(cases + _gate_groups(case, varlen=varlen[0][1], collinear_T=collinear_T,
                                      contract_T=contract_T, inside=inside, decode_T=decode_T))


def _gate_groups(case, *, varlen, collinear_T, contract_T, inside, decode_T):
    """The unbounded-gate, strong-decay and log-decay groups (the module's docstring)."""
    free = dict(gate="unbounded", lower_bound=None)  # fla's softplus gate
    given = dict(gate="log_decay", lower_bound=None, g_dtype="fp32")  # no promise
    return [
        case("unbounded/model_like", "fla's softplus gate -exp(A_log)*softplus(g + dt_bias), "
             "ordinary inputs (-0.05 to -7 per step, -1.9 on average)", **free),
        case("unbounded/varlen", f"the softplus gate, packed sequences of lengths "
             f"{list(varlen)}", seqlens=varlen, **free),
        case("unbounded/saturated", "raw gate +20: exp(A_log)*(20 + dt_bias), -20 to -57 per "
             "step", family="saturated", **free),
        case("unbounded/collinear", f"one shared key + 0.02*noise, beta -> 1, decay ~ 1, T = "
             f"{collinear_T}", family="collinear", key_noise=0.02, T=collinear_T, **free),
        case("unbounded/strongest", "about -20 per step in every channel: a 16-token chunk "
             "spans ~320, past a split exponent's fp32 range (88.7)", family="strongest_decay",
             **free),
        case("unbounded/causal", f"log-decay -20..-5, inputs changed at t >= {inside}: "
             f"outputs before it bit-identical", family="strong_decay", kind="causal",
             T=contract_T, split=inside, **free),
        # issue 43's stage 1 (kdalab at 794f0ca): a chunk wider than the split exponent's
        # range took the per-pair path for all of its rows, so the later rows' decay changed
        # the earlier rows' rounding (outputs before P by up to 2.4e-4)
        case("unbounded/causal_wide", f"model-like before t = {inside}, a log-decay of -20 a "
             f"step from it on (its chunk then spans past a split exponent's range): outputs "
             f"before it bit-identical", kind="causal", T=contract_T, split=inside,
             perturb="decay_past_split", **free),
        case("log_decay/causal_wide", f"the same as a given fp32 log-decay (fla's default "
             f"call): outputs before t = {inside} bit-identical", kind="causal", T=contract_T,
             split=inside, perturb="decay_past_split", **given),
        case("unbounded/decode", "log-decay -20..-5, decoded one token a step through a "
             "state pool, against fp64", family="strong_decay", kind="decode", batch=2,
             T=decode_T, **free),
        case("strong_decay/unbounded", "log-decay drawn in [-20, -5] per token and channel, "
             "the softplus gate", family="strong_decay", **free),
        case("strong_decay/log_decay", "log-decay drawn in [-20, -5], as an fp32 log-decay "
             "without a bound", family="strong_decay", **given),
        case("strong_decay/at_-20", "exactly -20 per step, as an fp32 log-decay",
             family="strongest_decay", **given),
        case("strong_decay/mixed", "a quarter of the channels at -20..-8 per step, the rest "
             "near 0, the softplus gate", family="mixed_decay", **free),
        case("strong_decay/mixed_bf16", "the mixture as a bf16 log-decay",
             family="mixed_decay", **{**given, "g_dtype": "bf16"}),
        case("log_decay/model_like", "the lower-bound gate computed outside the kernel: an "
             "fp32 log-decay with the bound -5 as its promise", gate="log_decay",
             g_dtype="fp32"),
        case("log_decay/unbounded", "fla's default call: the softplus gate computed outside "
             "(fused_kda_gate), an fp32 log-decay without a bound", **given),
    ]


#: The full suite: the issue's list at the H200 measurement's shape (T = 2048, H = 4,
#: K = V = 128). Four (K, V) pairs and varlen/fixed are the only shape keys fla autotunes on
#: (H is 4 throughout), so a new kernel compiles for few shapes.
FULL = _suite(
    Case("model_like", T=2048, heads=4, K=128, V=128),
    long_T=16384, range_T=512, poison_T=256,
    lengths=(1, 15, 17, 100),
    dims=((64, 64), (256, 256), (64, 128)),
    varlen=(("short", (1, 2, 1, 2, 33)), ("mixed", (300, 1, 2, 517, 15, 17, 1228)),
            ("empty", (300, 0, 517, 100))),
    poison_seqlens=(100, 77, 150),
    collinear_T=1024, contract_T=512, splits=(256, 229), batch_T=300, decode_T=256,
    long_causal_T=65536, long_split=40005,
)
#: The quick suite: the same cases at CPU size (T = 64, H = 2, K = V = 32), no long sequence.
QUICK = _suite(
    Case("model_like", T=64, heads=2, K=32, V=32),
    long_T=0, range_T=48, poison_T=40,
    lengths=(1, 17),
    dims=((32, 64),),
    varlen=(("mixed", (1, 2, 29, 17)), ("empty", (17, 0, 29))),
    poison_seqlens=None,
    collinear_T=256, contract_T=128, splits=(64, 37), batch_T=48, decode_T=32,
)
SUITES = {"quick": QUICK, "full": FULL}


def get_suite(name: str) -> tuple[Case, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {name!r}") from None


def select_cases(cases: tuple[Case, ...], patterns: str | None) -> tuple[Case, ...]:
    """The cases whose names match any of the comma-separated shell patterns (``T/*,varlen/*``);
    all for None. A pattern that matches nothing is an error (a typo would otherwise pass)."""
    if patterns is None:
        return cases
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    if not pats:
        raise ValueError("--cases: no pattern given")
    for p in pats:
        if not any(fnmatchcase(c.name, p) for c in cases):
            raise ValueError(f"--cases: {p!r} matches no case; cases are "
                             f"{', '.join(c.name for c in cases)}")
    return tuple(c for c in cases if any(fnmatchcase(c.name, p) for p in pats))


def case_spec(case: Case) -> SequenceSpec:
    """The case's distribution: its family's preset of :mod:`kdalab.inputs.sequences` at the
    case's shape and options (a collinear case's ``key_noise`` is the preset's ``key_eps``)."""
    changes = {"key_eps": case.key_noise} if case.family == "collinear" else {}
    return preset(case.family, T=case.T, batch=case.batch, seqlens=case.seqlens,
                  heads=case.heads, K=case.K, V=case.V, lower_bound=case.lower_bound,
                  g_as_log_decay=case.g_dtype if case.gate == "log_decay" else None,
                  initial_state=case.initial_state, state_scale=case.state_scale,
                  v_scale=case.v_scale, prenormalized=case.prenormalized, **changes)


def case_inputs(case: Case, device: str | torch.device = "cpu") -> CaseInputs:
    """The case's inputs: :func:`case_spec` drawn with the case's seed (on the CPU, so every
    device sees the same values), poisoned where the case says, then moved to ``device``; a
    replayed case's (``source``) are read from its file."""
    if case.source:
        return read_inputs(case.source).to(device)
    x = draw(case_spec(case), case.seed)
    b, t, n = case.batch, case.T, case.sequences
    k, v, cu = x["k"], x["v"], x["cu_seqlens"]
    rows = torch.ones(b, t, dtype=torch.bool)
    states = torch.ones(n, dtype=torch.bool)
    if case.poison:
        start = 0 if cu is None else int(cu[-2])
        length = t if cu is None else case.seqlens[-1]
        at = (b - 1, start + length // 2, 0, 0)
        if case.poison == "nan_v":
            v[at] = math.nan
        else:
            k[at] = math.inf
        if cu is None:
            rows[-1] = False
        else:
            rows[0, start:] = False
        states[-1] = False
    return CaseInputs(**x, rows=rows, states=states).to(device)


def reference(x: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp64 token recurrence (``kdalab.kda.reference_forward``) on the inputs' device:
    ``(o [B, T, H, V], final_state [N, H, K, V])`` in float64 (see :func:`recurrence`)."""
    return recurrence(x, reference_forward)


def recurrence(x: CaseInputs, forward) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward`` (``reference_forward``'s signature) on the case's inputs.

    Poisoned values are replaced by zeros (only the clean sequences are judged, and sequences do
    not interact); empty sequences are left out of the recurrence and keep their initial state.
    """
    q, k, v = (torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) for t in (x.q, x.k, x.v))
    kw = dict(scale=x.scale, A_log=x.A_log, dt_bias=x.dt_bias, lower_bound=x.lower_bound,
              gate=x.gate, use_qk_l2norm=x.use_qk_l2norm, output_final_state=True)
    cu, h0 = x.cu_seqlens, x.initial_state
    n = q.shape[0] if cu is None else len(cu) - 1
    if cu is None or bool((cu.diff() > 0).all()):
        return forward(q, k, v, x.g, x.beta, initial_state=h0, cu_seqlens=cu, **kw)
    keep = (cu.diff() > 0).nonzero().flatten()
    o, s = forward(q, k, v, x.g, x.beta, cu_seqlens=torch.unique_consecutive(cu),
                   initial_state=None if h0 is None else h0[keep], **kw)
    full = (s.new_zeros((n,) + s.shape[1:]) if h0 is None else h0.to(s.dtype).clone())
    full[keep] = s
    return o, full

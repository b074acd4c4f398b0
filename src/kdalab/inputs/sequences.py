"""The sequence-level input generator: one parametrized family of KDA forward inputs.

A :class:`SequenceSpec` is a frozen set of knobs; :func:`draw` turns a spec and a seed into the
keyword arguments of ``chunk_kda_fwd`` (bf16 ``q, k, v, g`` and β logits; float32 ``A_log``,
``dt_bias``; ``initial_state``; ``cu_seqlens``; ``lower_bound`` and ``scale``) and the gate mode,
drawn on a CPU ``torch.Generator`` so that every device sees the same bits. The named families are
values of the spec (:data:`PRESETS`), not code paths.

The knobs (each token of the *hard block* takes them; tokens outside it are ordinary: keys,
gate input and β logits ~ N(0, 1)):

- ``key_clusters``, ``key_eps``: 0 clusters: independent keys ~ N(0, 1). n >= 1: each key is
  one of n random centres (per batch row; the token's centre drawn uniformly) plus ``key_eps``
  times its own N(0, 1) noise: the cosine of two keys of a cluster is about 1 / (1 + eps²);
  eps = 0 repeats one key exactly.
- ``beta_mean``, ``beta_spread``: β logits ~ mean + spread · N(0, 1) (logit 10: β = 0.99995).
- ``g_mean``, ``g_spread``: the raw gate input ~ mean + spread · N(0, 1); the log-decay is
  ``lower_bound · sigmoid(exp(A_log) · (g + dt_bias))``, or ``−exp(A_log) · softplus(g +
  dt_bias)`` with ``lower_bound=None`` (the unbounded gate).
- ``log_decay``: instead of g_mean / g_spread, g solved per head and channel so that every step
  decays by exactly this log-decay.
- ``decay_range``: (low, high): instead, every step's log-decay drawn uniformly in [low, high] per
  token and key channel (g solved for it): strong decay, down to −20 per step, where a 16-token
  chunk spans far more than float32's exponent range (88.7).
- ``decay_channels``: the fraction of key channels (per head, drawn) that take ``log_decay`` or
  ``decay_range``; the others keep g_mean / g_spread: mixtures of strong and weak channels.
- ``g_as_log_decay``: None: g is the raw gate input (bf16). ``"fp32"`` or ``"bf16"``: g is the
  log-decay itself (the gate mode ``log_decay``, fla's precomputed g), in that dtype: the fp64
  gate of the raw draw, and exactly the drawn value where ``log_decay`` or ``decay_range`` set it;
  ``A_log`` and ``dt_bias`` are then None, and ``lower_bound`` (the formula the decay came from)
  is handed on as the promise that no step decays below it.
- ``A_log``, ``dt_bias``: (low, high): U(low, high) per head / per head and channel.
- ``v_scale``: v ~ v_scale · N(0, 1) (a power of two keeps bf16 v exact).
- ``initial_state``: ``none``, ``fp32`` or ``bf16``, N(0, 1) · ``state_scale``.
- ``block``: (start, length) of the hard block in every sequence (positions relative to the
  sequence's start); None: the whole sequence.
- ``prenormalized``: q and k L2-normalized before the bf16 cast, and ``use_qk_l2norm=False``
  (the caller normalized them, the kernel must not).

Shapes: ``batch`` sequences of length ``T``, or with ``seqlens`` packed along T (B = 1,
``cu_seqlens``; empty sequences allowed); ``heads``, ``K``, ``V``. The draw order is fixed (q,
key noise, v, key centres, gate noise, A_log, dt_bias, β noise, cluster choice, initial state,
decay range, strong channels), and a draw a spec does not use is skipped. The end-to-end study,
check's cases and the kernel benchmarks draw through here; :data:`MODEL_LIKE`, :data:`SATURATED` and
:data:`WEAK_DECAY_CORRELATED` give bit for bit what the study and check drew before they did
(tests/data/inputs_before.json; check's collinear keys with noise > 0 are the one change: the
noise is the ordinary key draw here). The gate mode (:data:`kdalab.kda.GATES`) is
:attr:`SequenceSpec.gate`: ``log_decay`` with ``g_as_log_decay``, else ``unbounded`` for
``lower_bound=None``, else ``lower_bound``; :func:`draw` hands it on as ``gate``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields, replace

import torch

from kdalab import params
from kdalab.arith import FP64
from kdalab.kda.gate import log_decay as gate_log_decay

__all__ = ["SequenceSpec", "draw", "kda_kwargs", "STATES", "STATE_DTYPES", "LOG_DECAY_DTYPES",
           "PRESETS", "preset", "MODEL_LIKE", "SATURATED", "WEAK_DECAY_CORRELATED", "LONG",
           "COLLINEAR", "STRONG_DECAY", "STRONGEST_DECAY", "MIXED_DECAY"]

STATES = ("none", "fp32", "bf16")
#: each initial state's dtype (None: no initial state)
STATE_DTYPES = {"none": None, "fp32": torch.float32, "bf16": torch.bfloat16}
#: the dtypes g may hold a log-decay in (``g_as_log_decay``)
LOG_DECAY_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class SequenceSpec:
    """The knobs of one input distribution (see the module's docstring). Validated on creation:
    a bad value raises ValueError naming its field."""

    T: int = 1024
    batch: int = 1
    seqlens: tuple[int, ...] | None = None
    heads: int = 2
    K: int = 128
    V: int = 128
    lower_bound: float | None = -5.0
    key_clusters: int = 0
    key_eps: float = 0.0
    beta_mean: float = 0.0
    beta_spread: float = 1.0
    g_mean: float = 0.0
    g_spread: float = 1.0
    log_decay: float | None = None
    A_log: tuple[float, float] = (0.0, 1.0)
    dt_bias: tuple[float, float] = (0.0, 1.0)
    v_scale: float = 1.0
    initial_state: str = "none"
    state_scale: float = 1.0
    block: tuple[int, int] | None = None
    prenormalized: bool = False
    decay_range: tuple[float, float] | None = None
    decay_channels: float = 1.0
    g_as_log_decay: str | None = None

    def __post_init__(self) -> None:
        def bad(name, what):
            raise ValueError(f"{name} must be {what}, got {getattr(self, name)!r}")

        def finite(name, low=-math.inf, low_ok=True):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x < low or (x == low and not low_ok):
                bad(name, f"a finite number {'>=' if low_ok else '>'} {low:g}"
                    if low > -math.inf else "a finite number")
            object.__setattr__(self, name, float(x))

        for name, low in (("T", 1), ("batch", 1), ("heads", 1), ("K", 1), ("V", 1),
                          ("key_clusters", 0)):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < low:
                bad(name, f"an integer >= {low}")
        if self.seqlens is not None:
            lens = tuple(self.seqlens)
            if (not lens or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                                for n in lens) or sum(lens) < 1):
                bad("seqlens", "lengths >= 0 (empty sequences allowed) with at least one token")
            if self.batch != 1:
                bad("batch", "1 with seqlens (sequences packed along T)")
            object.__setattr__(self, "seqlens", lens)
            object.__setattr__(self, "T", sum(lens))
        object.__setattr__(self, "lower_bound",
                           params.lower_bound(self.lower_bound, "lower_bound", unbounded=True))
        for name in ("key_eps", "beta_spread", "g_spread"):
            finite(name, 0.0)
        for name in ("beta_mean", "g_mean"):
            finite(name)
        for name in ("v_scale", "state_scale"):
            finite(name, 0.0, low_ok=False)
        lo = -math.inf if self.lower_bound is None else self.lower_bound
        if self.log_decay is not None:
            finite("log_decay")
            if not lo < self.log_decay < 0:
                bad("log_decay", f"None or a number in ({lo:g}, 0) (the gate's range)")
        if self.decay_range is not None:
            pair = self.decay_range
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                               and math.isfinite(x) for x in pair)
                    or not lo < pair[0] <= pair[1] < 0):
                bad("decay_range", f"None or a pair (low, high) with {lo:g} < low <= high < 0 "
                    f"(the gate's range)")
            if self.log_decay is not None:
                bad("decay_range", "None when log_decay is set (one fixed decay)")
            object.__setattr__(self, "decay_range", (float(pair[0]), float(pair[1])))
        x = self.decay_channels
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= 1:
            bad("decay_channels", "a fraction in (0, 1]")
        if x < 1 and self.log_decay is None and self.decay_range is None:
            bad("decay_channels", "1 unless log_decay or decay_range sets the decay it spreads")
        object.__setattr__(self, "decay_channels", float(x))
        if self.g_as_log_decay not in (None, *LOG_DECAY_DTYPES):
            bad("g_as_log_decay", f"None or one of {', '.join(LOG_DECAY_DTYPES)}")
        for name in ("A_log", "dt_bias"):
            pair = getattr(self, name)
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in pair)
                    or pair[0] > pair[1]):
                bad(name, "a pair (low, high) of finite numbers with low <= high")
            object.__setattr__(self, name, (float(pair[0]), float(pair[1])))
        if not isinstance(self.prenormalized, bool):
            bad("prenormalized", "True or False")
        if self.initial_state not in STATES:
            bad("initial_state", f"one of {', '.join(STATES)}")
        if self.block is not None:
            b = self.block
            if (not isinstance(b, (tuple, list)) or len(b) != 2
                    or any(isinstance(x, bool) or not isinstance(x, int) for x in b)
                    or b[0] < 0 or b[1] < 1):
                bad("block", "None or (start >= 0, length >= 1)")
            longest = max(self.seqlens) if self.seqlens is not None else self.T
            if b[0] >= longest:
                bad("block", f"a block starting inside the sequence (start < {longest})")
            object.__setattr__(self, "block", (b[0], b[1]))

    @property
    def sequences(self) -> int:
        return len(self.seqlens) if self.seqlens is not None else self.batch

    @property
    def gate(self) -> str:
        """The gate mode (one of :data:`kdalab.kda.GATES`)."""
        if self.g_as_log_decay is not None:
            return "log_decay"
        return "unbounded" if self.lower_bound is None else "lower_bound"

    def as_dict(self) -> dict:
        """JSON-ready (tuples as lists); :meth:`from_dict` reads it back."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @staticmethod
    def from_dict(d: dict) -> SequenceSpec:
        names = {f.name for f in fields(SequenceSpec)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"spec: unknown field(s) {', '.join(unknown)}; fields are "
                             f"{', '.join(sorted(names))}")
        return SequenceSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _solved_gate(spec: SequenceSpec, decay: torch.Tensor, a_log: torch.Tensor,
                 dt_bias: torch.Tensor) -> torch.Tensor:
    """The raw g whose gate gives the log-decay ``decay`` (float64, ``[..., H, K]``), solved in
    float64 and rounded to float32."""
    a = a_log.double()[:, None]
    if spec.lower_bound is None:  # exp(A)·softplus(g + dt) = −decay
        z = torch.log(torch.expm1(-decay / torch.exp(a)))
    else:  # lb·sigmoid(exp(A)·(g + dt)) = decay
        p = decay / spec.lower_bound
        z = torch.log(p / (1 - p)) / torch.exp(a)
    return (z - dt_bias.double()).float()


def draw(spec: SequenceSpec, seed: int, device: str | torch.device = "cpu") -> dict:
    """One draw of ``spec``: chunk_kda_fwd's keyword arguments (``q, k, v, g, beta, A_log,
    dt_bias, initial_state, cu_seqlens, lower_bound, scale, use_qk_l2norm``) and ``gate``, the gate
    mode, drawn on the CPU and moved to ``device``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    gen = torch.Generator().manual_seed(int(seed))
    b, t, h, kd, vd = spec.batch, spec.T, spec.heads, spec.K, spec.V

    def normal(*shape):
        return torch.randn(*shape, generator=gen)

    def uniform(pair, *shape):
        lo, hi = pair
        return torch.full(shape, lo) if lo == hi else lo + (hi - lo) * torch.rand(*shape,
                                                                                  generator=gen)

    whole = spec.block is None
    fixed = spec.log_decay is not None or spec.decay_range is not None  # a decay, not a gate
    everywhere = fixed and whole and spec.decay_channels == 1  # no token keeps the raw gate
    q, k_noise, v = normal(b, t, h, kd), normal(b, t, h, kd), normal(b, t, h, vd)
    centres = normal(b, spec.key_clusters, h, kd) if spec.key_clusters else None
    g_noise = None if everywhere else normal(b, t, h, kd)
    a_log, dt_bias = uniform(spec.A_log, h), uniform(spec.dt_bias, h, kd)
    b_noise = normal(b, t, h) if spec.beta_spread or not whole else None
    pick = (torch.randint(spec.key_clusters, (b, t, h), generator=gen)
            if spec.key_clusters > 1 else None)
    state = None
    if spec.initial_state != "none":
        state = normal(spec.sequences, h, kd, vd) * spec.state_scale
        state = state.bfloat16() if spec.initial_state == "bf16" else state
    decay = None  # the fixed log-decay, float64 [1 or B, 1 or T, H, K]
    if spec.decay_range is not None:
        decay = uniform(spec.decay_range, b, t, h, kd).double()
    elif spec.log_decay is not None:
        decay = torch.full((1, 1, h, kd), spec.log_decay, dtype=torch.float64)
    strong = None  # [H, K]: the channels that take it
    if spec.decay_channels < 1:
        n = max(1, round(spec.decay_channels * kd))
        strong = torch.rand(h, kd, generator=gen).argsort(-1) < n

    k = k_noise
    if centres is not None:
        idx = torch.zeros(b, t, h, dtype=torch.int64) if pick is None else pick
        chosen = _gather(centres, idx)
        k = chosen + spec.key_eps * k_noise
    if decay is not None:
        g = _solved_gate(spec, decay, a_log, dt_bias).expand(b, t, h, kd)
        if strong is not None:
            g = torch.where(strong, g, spec.g_mean + spec.g_spread * g_noise)
    else:
        g = spec.g_mean + spec.g_spread * g_noise
    if spec.prenormalized:
        q, k = (x / x.norm(dim=-1, keepdim=True) for x in (q, k))
    beta = (torch.full((b, t, h), spec.beta_mean) if b_noise is None
            else spec.beta_mean + spec.beta_spread * b_noise)
    cu = None
    if spec.seqlens is not None:
        cu = torch.tensor([0, *torch.tensor(spec.seqlens).cumsum(0).tolist()], dtype=torch.int64)
    hard = None
    if not whole:
        hard = _block_mask(spec, cu)
        k = torch.where(hard[..., None, None], k, k_noise)
        g = torch.where(hard[..., None, None], g, g_noise)
        beta = torch.where(hard[..., None], beta, b_noise)
    out = dict(q=q.bfloat16(), k=k.bfloat16(), v=(v * spec.v_scale).bfloat16(),
               g=g.bfloat16(), beta=beta.bfloat16(), A_log=a_log.float(),
               dt_bias=dt_bias.float(), initial_state=state, cu_seqlens=cu,
               lower_bound=spec.lower_bound, scale=kd ** -0.5,
               use_qk_l2norm=not spec.prenormalized, gate=spec.gate)
    if spec.g_as_log_decay is not None:
        out.update(g=_as_log_decay(spec, out, decay, strong, hard), A_log=None, dt_bias=None)
    return {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in out.items()}


def _as_log_decay(spec: SequenceSpec, raw: dict, decay, strong, hard) -> torch.Tensor:
    """g as the log-decay: the fp64 gate of the raw draw ``raw`` (what a caller computing the
    gate outside the kernel hands on), the fixed decay itself where it was set, in
    ``spec.g_as_log_decay``."""
    out = gate_log_decay(raw["g"], gate="unbounded" if spec.lower_bound is None
                         else "lower_bound", A_log=raw["A_log"], dt_bias=raw["dt_bias"],
                         lower_bound=spec.lower_bound, fmt=FP64)
    if decay is not None:
        where = torch.ones(out.shape, dtype=torch.bool)
        if strong is not None:
            where = where & strong
        if hard is not None:
            where = where & hard[..., None, None]
        out = torch.where(where, decay, out)
    return out.to(LOG_DECAY_DTYPES[spec.g_as_log_decay])


def _gather(centres: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``centres[b, idx[b, t, h], h, :]`` as ``[B, T, H, K]``."""
    b, t, h = idx.shape
    rows = torch.arange(b)[:, None, None].expand(b, t, h)
    heads = torch.arange(h)[None, None, :].expand(b, t, h)
    return centres[rows, idx, heads]


def _block_mask(spec: SequenceSpec, cu: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]``: True where a token lies in the hard block of its own sequence."""
    start, length = spec.block
    if cu is None:
        pos = torch.arange(spec.T).expand(spec.batch, spec.T)
    else:
        lens = cu.diff()
        pos = (torch.arange(spec.T) - torch.repeat_interleave(cu[:-1], lens))[None]
    return (pos >= start) & (pos < start + length)


def kda_kwargs(inputs: dict) -> dict:
    """A draw as :func:`kdalab.kda.forward`'s keyword arguments: β as logits (the gate mode is
    the draw's ``gate``)."""
    return {**inputs, "beta_is_logits": True}


#: FlashKDA's test distribution: q, k, v, g ~ N(0, 1); A_log ~ U(0, 1) per head, dt_bias ~ U(0, 1)
#: per channel; β logits ~ N(0, 1).
MODEL_LIKE = SequenceSpec()
#: g = +20: the gate at its lower bound at every step and channel (the seed's ``floor``).
SATURATED = replace(MODEL_LIKE, g_mean=20.0, g_spread=0.0)
#: One random key repeated at every step, β = 0.5 (logit 0), a log-decay of −0.01 per step
#: (A_log = dt_bias = 0): the high powers of L without exponent-range pressure.
WEAK_DECAY_CORRELATED = replace(MODEL_LIKE, key_clusters=1, key_eps=0.0, beta_mean=0.0,
                                beta_spread=0.0, log_decay=-0.01, A_log=(0.0, 0.0),
                                dt_bias=(0.0, 0.0))
#: model_like at T = 4096.
LONG = replace(MODEL_LIKE, T=4096)
#: Near-collinear keys (one shared key + 0.05·noise), β logit 10, raw gate −10 with A_log =
#: dt_bias = 0 (decay ≈ 1): |L| → 1, where a Neumann-series inverse breaks (issue 23).
COLLINEAR = replace(MODEL_LIKE, heads=4, key_clusters=1, key_eps=0.05, beta_mean=10.0,
                    beta_spread=0.0, g_mean=-10.0, g_spread=0.0, A_log=(0.0, 0.0),
                    dt_bias=(0.0, 0.0))

#: The unbounded gate with every step's log-decay drawn in [−20, −5] per token and channel: a
#: 16-token chunk spans about 200 in log space, so a split exponent exp(G_i)·exp(−G_j)
#: overflows float32 (past 88.7) without a safe path.
STRONG_DECAY = replace(MODEL_LIKE, lower_bound=None, decay_range=(-20.0, -5.0))
#: The unbounded gate at −20 per step in every channel (exactly −20 as a log-decay,
#: ``g_as_log_decay``; within g's bf16 rounding as a raw gate input).
STRONGEST_DECAY = replace(MODEL_LIKE, lower_bound=None, log_decay=-20.0)
#: A quarter of the key channels at −20…−8 per step, the others near 0 (raw gate N(−6, 1):
#: −0.004…−0.03 per step): a span check must route the strong channels, and their underflow
#: must not turn into NaN next to the weak ones.
MIXED_DECAY = replace(MODEL_LIKE, lower_bound=None, decay_range=(-20.0, -8.0),
                      decay_channels=0.25, g_mean=-6.0)

PRESETS: dict[str, SequenceSpec] = {
    "model_like": MODEL_LIKE, "saturated": SATURATED,
    "weak_decay_correlated": WEAK_DECAY_CORRELATED, "long": LONG, "collinear": COLLINEAR,
    "strong_decay": STRONG_DECAY, "strongest_decay": STRONGEST_DECAY,
    "mixed_decay": MIXED_DECAY,
}


def preset(name: str, **changes) -> SequenceSpec:
    """A named preset, with fields changed (``preset("collinear", T=256, key_eps=0.0)``)."""
    try:
        spec = PRESETS[name]
    except KeyError:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}") from None
    return replace(spec, **changes)

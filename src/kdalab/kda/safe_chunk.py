"""Dynamic range of the split-exponent decay scales: which chunk lengths a format can hold.

The kernels build L (and the other intra-chunk products) from *scale factors* exp(±(G_i − G_b)):
the row operand is multiplied by exp(G_i − G_b), the column operand by exp(G_b − G_j), so that one
dense GEMM yields exp(G_i − G_j). Each factor on its own must be representable. This module
answers, in closed form from a :class:`~kdalab.arith.formats.Format`'s constants, the largest
chunk length C whose factors all stay finite and non-zero (and, separately, all normal), for a
lower bound ``lb`` on the per-step log-decay and a boundary G_b.

Conventions (the ones the measurement in :mod:`kdalab.studies.dynamic_range` uses):

* **Lower bound.** The gate keeps g ∈ (lb, 0), an open interval. The worst case puts every step *at*
  the bound, g = lb (the seed's ``floor_e-5`` family), so G_i = i·lb (1-based i). An answer safe for
  g = lb is safe for every g ∈ [lb, 0): |G_i − G_b| only shrinks.
* **Exposed span.** ``k(C)``: the largest |G_i − G_b| over the chunk, in steps of |lb|, with G_b as
  :func:`kdalab.kda.intra.boundary_log_decay` defines it:

  ===========  ==========================================  ==========
  start        G_b = G_0 = 0 (before the first token)       k = C
  midpoint     G_b = G at 0-based token ⌊C/2⌋ (fla)          k = ⌊C/2⌋
  end          G_b = G_C (the last token, inclusive)         k = C − 1
  per_pair     exp(G_i − G_j), i ≥ j, formed per pair        k = C − 1
  ===========  ==========================================  ==========

  The three fixed boundaries expose both exp(+k|lb|) (overflow risk) and exp(−k|lb|) (underflow
  risk), because every row i gets exp(G_i − G_b) *and* exp(G_b − G_i). ``per_pair`` only forms
  exponents in [−(C−1)|lb|, 0]: it can never overflow (factors ≤ 1), only underflow.
* **Arithmetic of a factor** (``exp2_ftz=True``, the kernels' and the seed's path, see
  :mod:`kdalab.arith.exp2`): y = (G_i − G_b)·log₂e in float32, v = 2^y rounded to float32, flushed
  to +0 below 2⁻¹²⁶ (FTZ), then rounded to the scale format. ``exp2_ftz=False``: exp(x) rounded once
  to the scale format (subnormals as the format has them; a ``-ftz`` format flushes them).
* **Finite.** For IEEE formats: not ±inf. For saturating formats (OCP fp8 e4m3, no infinities)
  "finite" means *not saturated*: the value does not lie past the rounding interval of the largest
  finite number (448 for e4m3, i.e. exp(x) ≥ 464 is a failure even though the cast returns 448).

The thresholds on a factor's value (overflow at max + ½ulp, zero at the FTZ stage's or the
format's rounding edge, normal at tiny − ½·smallest subnormal) and the margin the answer keeps from
them are derived in docs/dynamic-range.md ("Derivation"); :class:`SafeChunk` reports that margin
so a user sees when the float32 roundings of the kernel path could move the answer by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from kdalab import params
from kdalab.arith import FP32, Format, get_format

__all__ = [
    "BOUNDARIES",
    "LN2",
    "Threshold",
    "ScaleLimits",
    "SafeChunk",
    "WeakestBound",
    "exposed_steps",
    "chunk_for_steps",
    "scale_limits",
    "safe_chunk",
    "weakest_lower_bound",
    "count_text",
]

BOUNDARIES = ("start", "midpoint", "end", "per_pair")
LN2 = math.log(2.0)
LOG2E = math.log2(math.e)


def exposed_steps(chunk: int, boundary: str) -> int:
    """k(C): the largest |G_i − G_b| a C-token chunk exposes, in steps at the bound."""
    return {"start": chunk, "midpoint": chunk // 2, "end": chunk - 1,
            "per_pair": chunk - 1}[boundary]


def chunk_for_steps(steps: int | None, boundary: str) -> int | None:
    """The largest C with k(C) ≤ ``steps`` (None: unbounded). Inverse of :func:`exposed_steps`."""
    if steps is None:
        return None
    return {"start": steps, "midpoint": 2 * steps + 1, "end": steps + 1,
            "per_pair": steps + 1}[boundary]


@dataclass(frozen=True)
class Threshold:
    """Where a factor exp(±x) stops being finite / non-zero / normal.

    ``log2_value``: log₂ of the value v at which it happens; ``x``: the exponent magnitude |x| (in
    natural-log units, i.e. |G_i − G_b|) from which on it happens; ``stage``: which rounding step
    decides it; ``formula``: the value in closed form.
    """

    kind: str  # "overflow", "zero" or "subnormal"
    stage: str
    formula: str
    log2_value: float

    @property
    def value(self) -> float:
        return 2.0 ** self.log2_value if self.log2_value < 1024 else math.inf

    @property
    def x(self) -> float:
        return abs(self.log2_value) * LN2

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "formula": self.formula,
                "log2_value": self.log2_value, "value": self.value, "x": self.x}


def _log2_overflow(fmt: Format) -> float:
    """log₂(max + ½ulp(max)): from this value on, rounding goes past the largest finite."""
    frac_max = math.ldexp(fmt.max, -fmt.emax)  # in [1, 2)
    return fmt.emax + math.log2(frac_max + math.ldexp(1.0, -fmt.man_bits - 1))


def _overflow_formula(fmt: Format) -> str:
    half_ulp = f"2^{fmt.emax - fmt.man_bits - 1}"
    return f"max + ½ulp = {fmt.max:.6g} + {half_ulp}"


def _log2_round_up_to_tiny(fmt: Format) -> float:
    """log₂(tiny − ½·smallest subnormal): at or above it a value rounds to ≥ tiny."""
    return fmt.emin + math.log2(1.0 - math.ldexp(1.0, -fmt.man_bits - 1))


@dataclass(frozen=True)
class ScaleLimits:
    """The decisive thresholds of one factor path: format, and the fp32 exp2-with-FTZ stage or not.

    ``overflow.x``: factors exp(x) with x ≥ this are non-finite (or saturated); ``zero.x``:
    factors exp(−x) with x beyond this are zero; ``subnormal.x``: beyond this they are not normal.
    """

    format: Format
    exp2_ftz: bool
    overflow: Threshold
    zero: Threshold
    subnormal: Threshold


def scale_limits(fmt: Format | str | tuple[int, int], exp2_ftz: bool = True) -> ScaleLimits:
    """The overflow, zero and subnormal thresholds of a factor, from the formats' constants."""
    fmt = get_format(fmt)
    name = fmt.name
    over = [Threshold("overflow", f"cast to {name}", _overflow_formula(fmt), _log2_overflow(fmt))]
    if fmt.subnormals:
        zero_f = Threshold("zero", f"cast to {name}",
                           f"½·smallest subnormal = 2^{fmt.emin - fmt.man_bits - 1}",
                           float(fmt.emin - fmt.man_bits - 1))
    else:
        zero_f = Threshold("zero", f"cast to {name} (subnormals flushed)",
                           f"tiny − ½·2^{fmt.emin - fmt.man_bits} = 2^{fmt.emin}·(1 − "
                           f"2^-{fmt.man_bits + 1})", _log2_round_up_to_tiny(fmt))
    zero = [zero_f]
    sub = [Threshold("subnormal", f"cast to {name}",
                     f"tiny − ½·smallest subnormal = 2^{fmt.emin}·(1 − 2^-{fmt.man_bits + 1})",
                     _log2_round_up_to_tiny(fmt))]
    if exp2_ftz:
        stage = "exp2 in fp32"
        over.append(Threshold("overflow", stage, "fp32 max + ½ulp = 2^128·(1 − 2^-25)",
                              _log2_overflow(FP32)))
        ftz = Threshold("zero", "exp2 in fp32 with FTZ",
                        "2^-126·(1 − 2^-24) (rounds below fp32's smallest normal, flushed)",
                        -126 + math.log2(1.0 - 2.0**-24))
        zero.append(ftz)
        sub.append(Threshold("subnormal", ftz.stage, ftz.formula, ftz.log2_value))
    # The first stage to fail decides: the lowest overflow value, the highest zero value.
    pick_over = min(over, key=lambda t: t.log2_value)
    pick_zero = max(zero, key=lambda t: t.log2_value)
    pick_sub = max(sub, key=lambda t: t.log2_value)
    return ScaleLimits(fmt, bool(exp2_ftz), pick_over, pick_zero, pick_sub)


def _steps_below(x: float, lb: float) -> int:
    """The largest integer k ≥ 0 with k·|lb| < x, in closed form and exact arithmetic (the two
    floats as fractions): bounded time for every finite lb, also where x/|lb| is past 2⁵³ and a
    float search would never move (lb = −1e−22 gives k ≈ 8.7·10²³)."""
    return max(math.ceil(Fraction(x) / Fraction(-lb)) - 1, 0)


def count_text(n: int | None) -> str:
    """An exact count as text: in full below 10¹⁵, else as ``8.733654e+23`` (Decimal: no float
    overflow for any size)."""
    if n is None:
        return "unbounded"
    return str(n) if abs(n) < 10**15 else format(Decimal(n), ".6e")


def _format_info(fmt: Format) -> dict:
    return {"name": fmt.name, "exp_bits": fmt.exp_bits, "man_bits": fmt.man_bits,
            "subnormals": fmt.subnormals, "overflow": fmt.overflow,
            "finite_only": fmt.finite_only, "max": fmt.max, "tiny": fmt.tiny,
            "smallest_subnormal": fmt.smallest_subnormal}


@dataclass(frozen=True)
class SafeChunk:
    """The calculator's answer for one (format, exp2_ftz, lower bound, boundary).

    ``max_chunk``: largest C whose factors are all finite and non-zero (None: unbounded, 0: none).
    ``max_chunk_normal``: largest C whose factors are all finite and normal.
    ``max_chunk_finite``/``max_chunk_nonzero``: the two conditions separately.
    ``steps_*``: the largest exposed span k (in steps of |lb|) under each condition.
    ``explanation``: the arithmetic, one line per step.
    """

    format: Format
    exp2_ftz: bool
    lower_bound: float
    boundary: str
    limits: ScaleLimits
    max_chunk: int | None
    max_chunk_normal: int | None
    max_chunk_finite: int | None
    max_chunk_nonzero: int | None
    steps_finite: int | None
    steps_nonzero: int
    steps_normal: int
    margin: float  # min over conditions of |x_threshold − k·|lb|| / x_threshold at the answer
    explanation: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "max_chunk": self.max_chunk,
            "max_chunk_normal": self.max_chunk_normal,
            "max_chunk_finite": self.max_chunk_finite,
            "max_chunk_nonzero": self.max_chunk_nonzero,
            "inputs": {"format": _format_info(self.format), "exp2_ftz": self.exp2_ftz,
                       "lower_bound": self.lower_bound, "boundary": self.boundary},
            "format": self.format.name,
            "exp2_ftz": self.exp2_ftz,
            "lower_bound": self.lower_bound,
            "boundary": self.boundary,
            "exposed_span": _SPAN_TEXT[self.boundary],
            "thresholds": {k: getattr(self.limits, k).to_dict()
                           for k in ("overflow", "zero", "subnormal")},
            "steps": {"finite": self.steps_finite, "nonzero": self.steps_nonzero,
                      "normal": self.steps_normal},
            "margin": self.margin,
            "convention": CONVENTION,
            "explanation": list(self.explanation),
        }


CONVENTION = ("g in (lower_bound, 0); the worst case puts every step at g = lower_bound, so "
              "G_i = i*lower_bound; a chunk safe there is safe for every g in [lower_bound, 0)")
_SPAN_TEXT = {
    "start": "G_b = G_0 = 0: |G_i - G_b| <= C*|lb| (both exp(+) and exp(-) formed)",
    "midpoint": "G_b = G at 0-based token floor(C/2): |G_i - G_b| <= floor(C/2)*|lb|",
    "end": "G_b = G_C (last token): |G_i - G_b| <= (C-1)*|lb|",
    "per_pair": "exp(G_i - G_j), i >= j: exponents in [-(C-1)*|lb|, 0]; never above 1",
}
_SPAN_FORMULA = {"start": "C", "midpoint": "⌊C/2⌋", "end": "C − 1", "per_pair": "C − 1"}


def safe_chunk(fmt: Format | str | tuple[int, int], lower_bound: float, boundary: str = "start",
               *, exp2_ftz: bool = True) -> SafeChunk:
    """The largest chunk length whose scale factors stay finite and non-zero (and normal).

    ``fmt``: the scale format (name, ``eXmY``, ``(exp_bits, man_bits)`` or a Format; a ``-ftz``
    suffix flushes its subnormals). ``lower_bound`` < 0. ``boundary``: start, midpoint, end or
    per_pair. ``exp2_ftz``: factors via float32 exp2 with flush-to-zero, then cast (the kernels).
    """
    fmt = params.scale_format(fmt, "fmt")
    lb = params.lower_bound(lower_bound)
    boundary = params.choice(boundary, "boundary", BOUNDARIES)
    limits = scale_limits(fmt, exp2_ftz)
    x_over, x_zero, x_sub = limits.overflow.x, limits.zero.x, limits.subnormal.x
    per_pair = boundary == "per_pair"
    k_fin = None if per_pair else _steps_below(x_over, lb)
    k_nz = _steps_below(x_zero, lb)
    k_nor = _steps_below(x_sub, lb)
    k_all = k_nz if k_fin is None else min(k_fin, k_nz)
    k_all_n = k_nor if k_fin is None else min(k_fin, k_nor)
    c_all = chunk_for_steps(k_all, boundary)
    c_norm = chunk_for_steps(k_all_n, boundary)

    # margin: how far the answer's span and the next span are from the decisive threshold
    # (exact: k·|lb| may be far past float range in k)
    def _margin(k: int, x: float) -> float:
        xf, af = Fraction(x), Fraction(-lb)
        return float(min(abs(xf - k * af), abs((k + 1) * af - xf)) / xf)

    margins = [_margin(k_nz, x_zero), _margin(k_nor, x_sub)]
    if k_fin is not None:
        margins.append(_margin(k_fin, x_over))
    margin = min(margins)

    a = abs(lb)
    lines = [
        f"Convention: g ∈ ({lb:g}, 0); worst case g = {lb:g} at every step, so "
        f"G_i = i·({lb:g}).",
        f"Boundary '{boundary}': {_SPAN_TEXT[boundary]}; span k(C) = {_SPAN_FORMULA[boundary]} "
        f"steps of {a:g}.",
        "Factor path: " + ("exp2(x·log2 e) in fp32 with flush-to-zero, then cast to "
                            f"{fmt.name}" if exp2_ftz else f"exp(x) rounded once to {fmt.name}")
        + f" ({fmt.name}: max {fmt.max:.6g}, smallest normal {fmt.tiny:.6g}, "
        + (f"smallest subnormal {fmt.smallest_subnormal:.6g}" if fmt.subnormals
           else "subnormals flushed") + (", saturating: 'finite' = not clamped"
                                         if fmt.overflow == "saturate" else "") + ").",
    ]
    if per_pair:
        lines.append("Overflow: impossible, every factor exp(G_i − G_j) ≤ 1.")
    else:
        t = limits.overflow
        lines.append(
            f"Overflow (decided by {t.stage}): exp(x) ≥ {t.formula} ⇔ x ≥ {t.x:.6f}; "
            f"k·{a:g} < {t.x:.4f} ⇔ k ≤ {count_text(k_fin)} ⇒ "
            f"C ≤ {count_text(chunk_for_steps(k_fin, boundary))}.")
    t = limits.zero
    lines.append(
        f"Zero (decided by {t.stage}): exp(−x) below {t.formula} ⇔ x > {t.x:.6f}; "
        f"k·{a:g} < {t.x:.4f} ⇔ k ≤ {count_text(k_nz)} ⇒ "
        f"C ≤ {count_text(chunk_for_steps(k_nz, boundary))}.")
    t = limits.subnormal
    lines.append(
        f"Normal (decided by {t.stage}): exp(−x) ≥ {t.formula} ⇔ x < {t.x:.6f}; "
        f"k ≤ {count_text(k_nor)} ⇒ C ≤ {count_text(chunk_for_steps(k_nor, boundary))}.")
    if c_all == 0:
        lines.append(f"Answer: no chunk length is safe (even C = 1 exposes exp(±{a:g})).")
    else:
        nxt = c_all + 1
        k_nxt = exposed_steps(nxt, boundary)
        span, span_nxt = float(k_all * Fraction(a)), float(k_nxt * Fraction(a))
        lines.append(
            f"Answer: C ≤ {count_text(c_all)} (span {count_text(k_all)}·{a:g} = {span:g}); "
            f"C = {count_text(nxt)} exposes {count_text(k_nxt)}·{a:g} = {span_nxt:g}.")
        if c_norm != c_all:
            lines.append(f"All factors normal only for C ≤ {count_text(c_norm)}.")
    if per_pair:
        lines.append("Per pair, a zero factor is exp(G_i − G_j) itself below the zero threshold: "
                     "flushing it changes L_ij by less than that times β_i·|k_i·k_j| "
                     "(harmless), so per_pair has no practical chunk limit; max_chunk says "
                     "where the first zero appears.")
    if margin < 1e-6:
        lines.append(f"Warning: the answer lies within {margin:.1e} (relative) of a threshold; "
                     "float32 rounding of x·log2 e may move it by one.")
    return SafeChunk(fmt, bool(exp2_ftz), lb, boundary, limits, c_all, c_norm,
                     chunk_for_steps(k_fin, boundary), chunk_for_steps(k_nz, boundary),
                     k_fin, k_nz, k_nor, margin, lines)


@dataclass(frozen=True)
class WeakestBound:
    """The inverse question: the most negative lower bound a chunk length admits.

    Every lb > ``lower_bound`` is safe (open: lb = ``lower_bound`` itself puts the worst exponent
    exactly on the threshold); None means every lower bound is safe. ``lower_bound_normal``: the
    same for all-normal factors.
    """

    format: Format
    exp2_ftz: bool
    chunk: int
    boundary: str
    steps: int
    lower_bound: float | None
    lower_bound_normal: float | None
    explanation: list[str]

    def to_dict(self) -> dict:
        return {"chunk": self.chunk, "boundary": self.boundary,
                "format": _format_info(self.format), "exp2_ftz": self.exp2_ftz,
                "steps": self.steps, "weakest_lower_bound": self.lower_bound,
                "weakest_lower_bound_normal": self.lower_bound_normal,
                "convention": CONVENTION + "; admissible: lower_bound > weakest_lower_bound",
                "explanation": list(self.explanation)}


def weakest_lower_bound(fmt: Format | str | tuple[int, int], chunk: int,
                        boundary: str = "start", *, exp2_ftz: bool = True) -> WeakestBound:
    """The infimum of the lower bounds for which a ``chunk``-token chunk is safe (see
    :class:`WeakestBound`)."""
    fmt = params.scale_format(fmt, "fmt")
    boundary = params.choice(boundary, "boundary", BOUNDARIES)
    chunk = params.integer(chunk, "chunk", 1)
    k = exposed_steps(chunk, boundary)
    limits = scale_limits(fmt, exp2_ftz)
    xs = [limits.zero.x] + ([] if boundary == "per_pair" else [limits.overflow.x])
    xn = [limits.subnormal.x] + ([] if boundary == "per_pair" else [limits.overflow.x])
    lines = [f"Boundary '{boundary}', C = {chunk}: span k = {_SPAN_FORMULA[boundary]} = {k} steps."]
    if k == 0:
        lines.append("No factor other than exp(0) = 1 is formed: every lower bound is safe.")
        return WeakestBound(fmt, bool(exp2_ftz), int(chunk), boundary, 0, None, None, lines)
    x, x_n = min(xs), min(xn)
    lb, lb_n = -float(Fraction(x) / k), -float(Fraction(x_n) / k)  # exact, then rounded
    if lb_n == 0.0:
        raise ValueError(f"chunk: {count_text(chunk)} tokens span {count_text(k)} steps, which "
                         f"only a lower bound closer to 0 than −{x_n:.6g}/{count_text(k)} keeps "
                         "safe, and float64 holds none: refused")
    lines.append(f"Need k·|lb| < {x:.6f} (finite and non-zero) ⇒ lb > −{x:.6f}/{count_text(k)} "
                 f"= {lb:.6g}.")
    lines.append(f"Need k·|lb| < {x_n:.6f} (all normal) ⇒ lb > {lb_n:.6g}.")
    return WeakestBound(fmt, bool(exp2_ftz), int(chunk), boundary, k, lb, lb_n, lines)

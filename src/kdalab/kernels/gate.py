"""The gate, one set of Triton helpers for every kernel (prefill stage 1, decode, backward):
the per-step log-decay of a gate tile in base 2, its derivatives, and the split exponent's
range.

Three gates (``contract.Gate``; codes ``GATE_*``), in base 2 (the kernels take exp2):

    lower-bounded  lower_bound · sigmoid(a · (g + dt_bias)) · log2(e)     a = exp(A_log)
    softplus       -a · softplus(g + dt_bias) · log2(e)                    (fla's unbounded)
    log-decay      g · log2(e)                                             (g given)

Absent ``A_log``/``dt_bias`` are passed as ``a = 1`` and ``bias = 0``: x·1 and x + 0 are x
exactly, so one code path serves both.

The split exponent: a chunk's pairwise decay exp(G_i - G_j) is formed as exp(G_i) · exp(-G_j)
(dense tensor-core products). That needs both factors normal in fp32: the chunk's cumulative
log-decay must stay within ``SPLIT_SPAN2`` (base 2; 80 natural: 16 steps of the bound -5, the
lab's dynamic-range boundary at chunk 16, docs/dynamic-range.md), or a chunk takes the
per-pair path (``chunk_prepare.py``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
#: the split exponent's range in base 2: 80 · log2(e)
SPLIT_SPAN2 = tl.constexpr(115.41560327111707)
GATE_LOWER_BOUND = tl.constexpr(0)
GATE_SOFTPLUS = tl.constexpr(1)
GATE_LOG_DECAY = tl.constexpr(2)


# chosen at import, as triton.jit itself chooses between compiling and interpreting
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    @triton.jit
    def log2_approx(x):
        """log2 of x >= 1 on the GPU's special-function unit (PTX ``lg2.approx.ftz.f32``:
        absolute error at most 2^-22.6 in (0.5, 2), PTX ISA), one instruction where
        ``tl.log2`` is a 9-term polynomial."""
        return libdevice.fast_log2f(x)

    @triton.jit
    def exp2_ftz(x):
        """2^x on the special-function unit with subnormal results flushed to zero
        (libdevice's ``exp2f``, which Triton links with flushing on: ``ex2.approx.ftz.f32``,
        one instruction). ``tl.exp2`` (``ex2.approx.f32``) spends three more a value on the
        subnormal range (a compare, a halving before, a squaring after), yet its squaring is
        flushed too: on the H200 both give 0 below 2^-126 and the same bits everywhere else
        (tests/test_kernels.py's gate-helper test, at 7e941d1), so this is ``tl.exp2`` at a
        quarter of the instructions."""
        return libdevice.exp2(x)

    @triton.jit
    def div_approx(x, y):
        """x / y for y >= 1 by the special-function unit's reciprocal (``__fdividef``: at
        most 2 ulp for y below 2^126, 0 above, so x / inf = 0): two instructions where the
        IEEE division takes about ten."""
        return libdevice.fast_dividef(x, y)
else:
    @triton.jit
    def log2_approx(x):
        """In the interpreter (which has no special-function unit): ``tl.log2``, exact to
        fp32, as the interpreter's ``tl.exp2`` stands for the GPU's ``ex2.approx``."""
        return tl.log2(x)

    @triton.jit
    def exp2_ftz(x):
        """In the interpreter: ``tl.exp2``, which stands for ``ex2.approx`` (subnormal
        results kept, where the GPU's ``tl.exp2`` and this both flush; no stage-1 factor is
        subnormal)."""
        return tl.exp2(x)

    @triton.jit
    def div_approx(x, y):
        """In the interpreter: the IEEE ``x / y``, for the GPU's 2-ulp division."""
        return x / y


@triton.jit
def softplus(x):
    """log(1 + e^x) in fp32 without overflow and without losing small values:
    max(x, 0) + log1p(u), u = e^-|x| in (0, 1]; log1p(u) as its series to u^5 below 2^-5
    (relative error below 2^-25 / 6) and as log2(1 + u) · ln 2 on the special-function unit
    above (``log2_approx``: 1 + u rounds by at most 2^-24 and log2 errs by at most 2^-22.6,
    so log1p's absolute error stays below 1.7e-7, its relative error below 6e-6 where
    log1p >= 0.03; measured in the interpreter 1.6e-6 over -40..40). The earlier form (fp32
    ``tl.log``, a polynomial, and a division correcting 1 + u) made the unbounded gate's
    stage 1 1.6x the bounded gate's on the H200 (docs/BENCHMARKS.md gates_h200)."""
    u = exp2_ftz(-tl.abs(x) * LOG2E)  # tl.exp's form; u below 2^-126 adds nothing to x
    series = u * (1.0 - u * (0.5 - u * (0.3333333333333333 - u * (0.25 - u * 0.2))))
    l1p = tl.where(u < 0.03125, series, log2_approx(1.0 + u) * LN2)
    return tl.maximum(x, 0.0) + l1p


@triton.jit
def gate_params(a_log_ptr, dt_bias_ptr, i_g, o_k, K: tl.constexpr, HAS_A_LOG: tl.constexpr,
                HAS_DT_BIAS: tl.constexpr):
    """(a = exp(A_log[i_g]) or 1, dt_bias[i_g, o_k] or 0) for gate head ``i_g``."""
    if HAS_A_LOG:
        a = tl.exp(tl.load(a_log_ptr + i_g).to(tl.float32))
    else:
        a = 1.0
    if HAS_DT_BIAS:
        bias = tl.load(dt_bias_ptr + i_g * K + o_k).to(tl.float32)
    else:
        bias = tl.zeros(o_k.shape, dtype=tl.float32)
    return a, bias


@triton.jit
def log2_decay(x, a, bias, lower_bound, keep, GATE: tl.constexpr):
    """The base-2 log-decay of gate tile ``x`` (any shape; ``bias`` broadcast over its last
    axis), zero where ``keep`` is false (padded rows, so a cumulative sum ends at the last
    real row's). The select comes before the product by log2(e): it keeps that product apart
    from a following cumulative sum's first addition, which the compiler would otherwise
    contract into an FMA."""
    x = x.to(tl.float32)
    if GATE == GATE_LOG_DECAY:
        y = x
    elif GATE == GATE_LOWER_BOUND:
        # lb · sigmoid(u) = lb / (1 + exp(-u)) on the special-function unit: exp(-u) as
        # 2^((x + bias) · (-a log2 e)), one product an element (the scalar once), flushed
        # (e below 2^-126 leaves 1 + e = 1); the division within 2 ulp of IEEE's
        y = div_approx(tl.full(x.shape, lower_bound, tl.float32),
                       1 + exp2_ftz((x + bias) * (-a * LOG2E)))
    else:
        y = -(a * softplus(x + bias))
    return tl.where(keep, y, 0.0) * LOG2E


@triton.jit
def log2_decay_grads(x, a, bias, lower_bound, GATE: tl.constexpr):
    """(dy/dx, dy/dA_log) of y = ``log2_decay(x)`` (base 2), elementwise; dt_bias's
    derivative is dy/dx. With a = exp(A_log), z = x + bias:

        lower-bounded  dy/dx = lb·log2e · a·σ(az)σ(-az),     dy/dA_log = dy/dx · z
        softplus       dy/dx = -log2e · a·σ(z),                dy/dA_log = y
        log-decay      dy/dx = log2e,                          dy/dA_log = 0
    """
    x = x.to(tl.float32)
    if GATE == GATE_LOG_DECAY:
        dx = tl.full(x.shape, 1.0, tl.float32) * LOG2E
        da = tl.zeros(x.shape, dtype=tl.float32)
    elif GATE == GATE_LOWER_BOUND:
        z = x + bias
        # σ'(u) = σ(u) σ(-u) = e / (1 + e)^2 with e = exp(-|u|) (one exponential, one
        # division): σ(1 - σ) would round to 0 where σ saturates to 1 in fp32, and the
        # gate's gradient with it; e / (1 + e)^2 stays e there
        e = tl.exp(-tl.abs(a * z))
        dx = (lower_bound * LOG2E) * (a * (e / ((1.0 + e) * (1.0 + e))))
        da = dx * z
    else:
        z = x + bias
        dx = -LOG2E * (a * tl.sigmoid(z))
        da = -LOG2E * (a * softplus(z))
    return dx, da

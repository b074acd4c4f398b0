"""The search space: the user's bounds (:class:`Bounds`) and the map from an Optuna trial's
parameters to a :class:`~kdalab.inputs.sequences.SequenceSpec` (:func:`suggest`).

Every parameter is sampled in every trial (no conditional space: TPE's multivariate model then
sees one joint space), and the ranges put real mass on the hard region without naming it:

==================  =======================================================  ===================
parameter           range (prior)                                            hard region's mass
==================  =======================================================  ===================
``T``               [min_T, max_T], log-uniform integer
``heads``           [min_heads, max_heads]
``dim``             K = V, one of the dims the target takes
``lower_bound``     [lb_low, lb_high]
``sequences``       [1, max_sequences]; ``packed``: packed along T or a batch
``key_clusters``    [0, 8] (0: independent keys)                              8/9 clustered
``log10_key_eps``   [−5, 0.5]; below −4 the noise is exactly 0                18 % eps = 0,
                                                                             73 % eps < 0.1
``beta_mean``       logit in [−4, 12], ``beta_spread`` in [0, 3]               38 % logit > 6
``g_mean``          raw gate in [−14, 20], ``g_spread`` in [0, 3]              18 % below −8
``A_log``           low in [−3, 1], width in [0, 1]
``dt_bias``         low in [−2, 2], width in [0, 1]
``log2_v_scale``    integer in [−8, 17] (2^17: past fp16's range)
``initial_state``   the dtypes the target takes, or none;
                    ``log2_state_scale`` integer in [−8, 17]
``block_fraction``  [0, 1.25] of T (≥ 1: the whole sequence)                 20 % whole
``block_position``  [0, 1] of what is left, on a 64-token grid, + ``block_offset`` in [0, 63]
``gate``            the gate modes the target takes of ``gates``: the raw lower-bound gate,
                    fla's softplus gate (``unbounded``, the raw gate above without a bound), or
                    ``log_decay`` (the same as an fp32 log-decay, no bound promised)
``strong_channels`` [−0.25, 1]: the fraction of key channels whose log-decay is   20 % none
                    drawn in [``strong_low``, ``strong_low``·``strong_high_ratio``] per token
                    (``strong_low`` in [−20, −2], the ratio in [0.25, 1]); ≤ 0: none. Not
                    used by the lower-bound gate
==================  =======================================================  ===================

``gate`` is asked only when ``gates`` holds more than one mode, the strong-decay knobs only when
it holds ``unbounded`` or ``log_decay``: a hunt of the lower-bound gate alone asks what it asked
before they existed (and resumes a hunt recorded then).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdalab import params
from kdalab.inputs.sequences import SequenceSpec
from kdalab.kda import GATES

__all__ = ["Bounds", "suggest", "EPS_ZERO_BELOW", "GRID", "GATES"]

EPS_ZERO_BELOW = -4.0  # log10 eps below this: the keys of a cluster are one key, exactly
GRID = 64  # the block's start snaps to multiples of 64 (fla's chunk; four of kdalab's 16), + offset


@dataclass(frozen=True)
class Bounds:
    """What the user lets the search vary, parsed on creation by :mod:`kdalab.params` (text or
    typed values: ``dims="64,128"``, ``lower_bound="-5:-1"``; ValueError naming the field)."""

    min_T: int = 16
    max_T: int = 256
    min_heads: int = 1
    max_heads: int = 4
    dims: tuple[int, ...] = (64, 128)
    lower_bound: tuple[float, float] = (-5.0, -1.0)
    max_sequences: int = 2
    initial_states: tuple[str, ...] = ("none", "fp32", "bf16")
    gates: tuple[str, ...] = GATES

    def __post_init__(self) -> None:
        for name in ("min_T", "max_T", "min_heads", "max_heads", "max_sequences"):
            object.__setattr__(self, name, params.integer(getattr(self, name), name, 1))
        if self.min_T > self.max_T:
            raise ValueError(f"min_T must be <= max_T, got {self.min_T} > {self.max_T}")
        if self.min_heads > self.max_heads:
            raise ValueError(f"min_heads must be <= max_heads, got {self.min_heads} > "
                             f"{self.max_heads}")
        object.__setattr__(self, "dims", params.int_list(self.dims, "dims", minimum=1))
        object.__setattr__(self, "lower_bound",
                           params.lower_bound_range(self.lower_bound, "lower_bound"))
        states = tuple(self.initial_states)
        if not states or any(s not in ("none", "fp32", "bf16") for s in states):
            raise ValueError(f"initial_states must be some of none, fp32, bf16, got "
                             f"{self.initial_states!r}")
        object.__setattr__(self, "initial_states", tuple(dict.fromkeys(states)))
        gates = tuple(self.gates)
        if not gates or any(g not in GATES for g in gates):
            raise ValueError(f"gates must be some of {', '.join(GATES)}, got {self.gates!r}")
        object.__setattr__(self, "gates", tuple(dict.fromkeys(gates)))

    def as_dict(self) -> dict:
        return {"min_T": self.min_T, "max_T": self.max_T, "min_heads": self.min_heads,
                "max_heads": self.max_heads, "dims": list(self.dims),
                "lower_bound": list(self.lower_bound), "max_sequences": self.max_sequences,
                "initial_states": list(self.initial_states), "gates": list(self.gates)}


def _float(trial, name, low, high):
    return trial.suggest_float(name, low, high) if low < high else low


def _int(trial, name, low, high, log=False):
    return trial.suggest_int(name, low, high, log=log) if low < high else low


def suggest(trial, bounds: Bounds) -> SequenceSpec:
    """The spec of one trial: every parameter asked of ``trial`` (an ``optuna.Trial``), in a fixed
    order."""
    t = _int(trial, "T", bounds.min_T, bounds.max_T, log=True)
    heads = _int(trial, "heads", bounds.min_heads, bounds.max_heads)
    dim = (trial.suggest_categorical("dim", bounds.dims) if len(bounds.dims) > 1
           else bounds.dims[0])
    lower_bound = _float(trial, "lower_bound", *bounds.lower_bound)
    sequences = _int(trial, "sequences", 1, bounds.max_sequences)
    packed = trial.suggest_categorical("packed", (False, True))  # asked always: a static space
    clusters = trial.suggest_int("key_clusters", 0, 8)
    log_eps = trial.suggest_float("log10_key_eps", -5.0, 0.5)
    beta_mean = trial.suggest_float("beta_mean", -4.0, 12.0)
    beta_spread = trial.suggest_float("beta_spread", 0.0, 3.0)
    g_mean = trial.suggest_float("g_mean", -14.0, 20.0)
    g_spread = trial.suggest_float("g_spread", 0.0, 3.0)
    a_low, a_width = trial.suggest_float("A_log_low", -3.0, 1.0), trial.suggest_float(
        "A_log_width", 0.0, 1.0)
    d_low, d_width = trial.suggest_float("dt_bias_low", -2.0, 2.0), trial.suggest_float(
        "dt_bias_width", 0.0, 1.0)
    v_scale = 2.0 ** trial.suggest_int("log2_v_scale", -8, 17)
    state = (trial.suggest_categorical("initial_state", bounds.initial_states)
             if len(bounds.initial_states) > 1 else bounds.initial_states[0])
    state_scale = 2.0 ** trial.suggest_int("log2_state_scale", -8, 17)
    fraction = trial.suggest_float("block_fraction", 0.0, 1.25)
    position = trial.suggest_float("block_position", 0.0, 1.0)
    offset = trial.suggest_int("block_offset", 0, GRID - 1)
    gate = (trial.suggest_categorical("gate", bounds.gates) if len(bounds.gates) > 1
            else bounds.gates[0])
    decay = {}  # the strong-decay knobs, for the gates without a bound
    if set(bounds.gates) - {"lower_bound"}:
        channels = trial.suggest_float("strong_channels", -0.25, 1.0)
        low = trial.suggest_float("strong_low", -20.0, -2.0)
        ratio = trial.suggest_float("strong_high_ratio", 0.25, 1.0)
        if gate != "lower_bound" and channels > 0:
            decay = dict(decay_range=(low, low * ratio), decay_channels=channels)
    if gate != "lower_bound":
        lower_bound = None
        decay["g_as_log_decay"] = "fp32" if gate == "log_decay" else None

    length = max(1, round(fraction * t))
    block = None
    if length < t:
        start = min(int(position * (t - length)) // GRID * GRID + offset, t - length)
        block = (start, length)
    shape = dict(T=t) if sequences == 1 else (
        dict(seqlens=(t,) * sequences) if packed else dict(T=t, batch=sequences))
    return SequenceSpec(
        **shape, heads=heads, K=dim, V=dim, lower_bound=lower_bound, key_clusters=clusters,
        key_eps=0.0 if log_eps < EPS_ZERO_BELOW else 10.0 ** log_eps, beta_mean=beta_mean,
        beta_spread=beta_spread, g_mean=g_mean, g_spread=g_spread,
        A_log=(a_low, a_low + a_width), dt_bias=(d_low, d_low + d_width), v_scale=v_scale,
        initial_state=state, state_scale=state_scale, block=block, **decay)

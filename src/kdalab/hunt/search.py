"""The search: Optuna's TPE sampler (multivariate, seeded) over :mod:`kdalab.hunt.space`,
maximizing log10 of the output error against the fp64 recurrence, or with ``grad`` of the worst
gradient error against the fp64 reference's (docs/hunt.md says why TPE).

The loop is Optuna's ask-and-tell: each trial asks the sampler for the parameters, draws the
inputs (a :class:`~kdalab.inputs.sequences.SequenceSpec` and a seed derived from the hunt's seed
and the trial's number), evaluates the target and tells the sampler the objective. A trial the
kernel declares unsupported is told as pruned (the sampler learns to avoid it), one where the
kernel raised as failed; both are recorded. It stops after ``trials`` trials or when the
``budget_s`` seconds are spent, whichever comes first: with ``trials`` and no time limit the
same seed gives the same trials and the same worst case, bit for bit, wherever the target and
the reference are deterministic (on the CPU the hunt runs on one thread for this); with a time
budget the count depends on the machine's speed.

A hunt resumes from its records (``history``): each recorded trial is told to a new study again
(:func:`replay`, the same parameters, objective and state), so the new trials continue the
numbering and ``draw_seed`` never repeats a draw. The sampler's random state is not recorded, so a
resumed sampler is seeded with :func:`sampler_seed` of the hunt's seed and the number of trials
already done: a split hunt is reproducible for the same split, but differs from the unsplit one
after the split (docs/hunt.md).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from kdalab.check.harness import one_thread
from kdalab.hunt.evaluate import evaluate, objective, score
from kdalab.hunt.space import Bounds, suggest
from kdalab.hunt.target import Target, resolve
from kdalab.inputs.sequences import STATE_DTYPES, SequenceSpec, draw

__all__ = ["HuntConfig", "HuntResult", "run_hunt", "summarize", "draw_seed", "sampler_seed",
           "supported_bounds", "replay", "SAMPLER"]

#: the sampler, as the records name it
SAMPLER = "optuna TPESampler(multivariate=True, n_startup_trials=10, seed=SEED)"


@dataclass(frozen=True)
class HuntConfig:
    """One hunt. ``trials`` and ``budget_s`` (seconds) bound it, either may be None (not both);
    ``threshold``: an output error above it is a finding (``grad``: a gradient error; the
    search maximizes the worst gradient's error instead of the output's)."""

    target: str
    device: str = "cpu"
    seed: int = 0
    trials: int | None = None
    budget_s: float | None = 300.0
    threshold: float = 1e-2
    bounds: Bounds = field(default_factory=Bounds)
    grad: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (
                0 <= self.seed < 2**32):  # the sampler's seed is 32 bits
            raise ValueError(f"seed must be an integer in [0, 2**32 - 1], got {self.seed!r}")
        if self.trials is not None and (isinstance(self.trials, bool)
                                        or not isinstance(self.trials, int) or self.trials < 1):
            raise ValueError(f"trials must be an integer >= 1, got {self.trials!r}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s)
                                              and self.budget_s > 0):
            raise ValueError(f"budget_s must be a number of seconds > 0, got {self.budget_s!r}")
        if self.trials is None and self.budget_s is None:
            raise ValueError("budget_s: give a time budget, a number of trials, or both")
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            raise ValueError(f"threshold must be a finite number > 0, got {self.threshold!r}")

    def as_dict(self) -> dict:
        return {"target": self.target, "device": self.device, "seed": self.seed,
                "trials": self.trials, "budget_s": self.budget_s, "threshold": self.threshold,
                "bounds": self.bounds.as_dict(), "sampler": SAMPLER,
                **({"grad": True} if self.grad else {})}  # an output hunt's as before


@dataclass
class HuntResult:
    """The trial records (in order), the worst measured one (highest objective, the earliest on
    a tie) and the verdict: ``found`` when the worst output error (``--grad``: gradient error)
    exceeds the threshold, or any output, state (or gradient) was non-finite, or the kernel
    raised on a trial."""

    records: list[dict]
    worst: dict | None
    found: bool
    counts: dict[str, int]
    elapsed_s: float


def draw_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s draw (a 32-bit integer from NumPy's SeedSequence)."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def sampler_seed(seed: int, done: int) -> int:
    """The sampler's seed for a hunt with ``done`` trials already run: the hunt's seed itself for a
    fresh hunt (an unsplit hunt is unchanged), otherwise a 32-bit integer derived from both (a
    resumed sampler seeded with the hunt's seed would draw its first trials' random start again)."""
    if done == 0:
        return seed
    return int(np.random.SeedSequence([seed, done, 1]).generate_state(1)[0])


def replay(study, history: list[dict], bounds: Bounds) -> None:
    """Tells ``study`` (new, empty) the recorded trials again, numbered 0, 1, ... as recorded: the
    parameters with their distributions (asked again of an ``optuna.trial.FixedTrial`` through
    :func:`suggest`), the objective of a measured trial, the pruned or failed state of the
    others. ValueError when a record's parameters do not fit ``bounds`` or the records are not
    numbered 0, 1, ..."""
    import optuna

    states = {"unsupported": optuna.trial.TrialState.PRUNED,
              "raised": optuna.trial.TrialState.FAIL}
    for i, rec in enumerate(history):
        if rec["trial"] != i:
            raise ValueError(f"resume: the records are not numbered 0, 1, ...: record {i} is "
                             f"trial {rec['trial']}")
        fixed = optuna.trial.FixedTrial(rec["params"], number=i)
        try:
            suggest(fixed, bounds)
        except ValueError as exc:
            raise ValueError(f"resume: trial {i}'s parameters do not fit the bounds ({exc})") \
                from None
        measured = rec["status"] == "measured"
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if measured else states[rec["status"]],
            value=rec["objective"] if measured else None, params=fixed.params,
            distributions=fixed.distributions))


#: a one-token spec of each gate mode (what supported_bounds asks the target about)
_GATE_SPECS = {"lower_bound": {}, "unbounded": {"lower_bound": None},
               "log_decay": {"lower_bound": None, "g_as_log_decay": "fp32"}}


def supported_bounds(bounds: Bounds, target: Target) -> Bounds:
    """``bounds`` without the head dims, initial-state dtypes and gate modes the target declares
    it cannot take; ValueError when no dim or no gate is left, or when the lower bounds reach
    beyond those it takes (the search would meet the refusal on its trials)."""
    lowest, highest = bounds.lower_bound

    def declared(K, V, lower_bound=None, initial_state="none", gate="lower_bound"):
        if target.declines is not None:  # the declaration itself (lower_bound None: any)
            return target.declines(K=K, V=V, lower_bound=lower_bound, gate=gate,
                                   state_dtype=STATE_DTYPES[initial_state])
        spec = SequenceSpec(T=1, heads=1, K=K, V=V, initial_state=initial_state,
                            **_GATE_SPECS[gate], **({} if gate != "lower_bound" else {
                                "lower_bound": highest if lower_bound is None
                                else lower_bound}))
        return target.why_not(draw(spec, 0, target.device))

    dims = tuple(d for d in bounds.dims if declared(K=d, V=d) is None)
    if not dims:
        why = declared(K=bounds.dims[0], V=bounds.dims[0])
        raise ValueError(f"dims: {target.name} takes none of {', '.join(map(str, bounds.dims))} "
                         f"({why})")
    gates = tuple(g for g in bounds.gates if declared(K=dims[0], V=dims[0], gate=g) is None)
    if not gates:
        why = declared(K=dims[0], V=dims[0], gate=bounds.gates[0])
        raise ValueError(f"gates: {target.name} takes none of {', '.join(bounds.gates)} "
                         f"({why})")
    if "lower_bound" in gates:
        for lb in (lowest, highest):  # a kernel takes one interval of lower bounds
            why = declared(K=dims[0], V=dims[0], lower_bound=lb)
            if why is not None:
                raise ValueError(f"lower_bound {lowest:g}:{highest:g} reaches beyond what "
                                 f"{target.name} takes ({why})")
    states = tuple(s for s in bounds.initial_states
                   if s == "none" or declared(K=dims[0], V=dims[0], initial_state=s) is None)
    return replace(bounds, dims=dims, initial_states=states or ("none",), gates=gates)


@contextlib.contextmanager
def _quiet_optuna():
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield optuna
    finally:
        optuna.logging.set_verbosity(level)


def run_hunt(cfg: HuntConfig, *, sink: Callable[[dict], None] | None = None,
             progress: Callable[[int, float, dict | None], None] | None = None,
             target: Target | None = None, history: list[dict] = ()) -> HuntResult:
    """Search; ``sink`` receives each trial's record as it ends, ``progress(trials, seconds,
    worst record so far)`` after each trial. ``target`` replaces the resolved ``cfg.target``
    (tests plant kernels this way). ``history``: the records of the hunt so far, to resume it
    (:func:`replay`); ``cfg.trials`` and ``cfg.budget_s`` then bound the trials added, while the
    records, the trial count of ``progress``, their ``elapsed_s`` (the search's seconds summed
    over the runs) and the result cover all trials."""
    target = target or resolve(cfg.target, cfg.device, cfg.grad)
    bounds = supported_bounds(cfg.bounds, target)
    records: list[dict] = list(history)
    best = summarize(records, cfg.threshold, 0.0, cfg.grad).worst
    before = records[-1]["elapsed_s"] if records else 0.0
    t0 = time.perf_counter()
    with _quiet_optuna() as optuna, one_thread(cfg.device):
        sampler = optuna.samplers.TPESampler(seed=sampler_seed(cfg.seed, len(records)),
                                             multivariate=True, n_startup_trials=10)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        replay(study, records, bounds)
        while cfg.trials is None or len(records) - len(history) < cfg.trials:
            if cfg.budget_s is not None and time.perf_counter() - t0 >= cfg.budget_s:
                break
            trial = study.ask()
            spec = suggest(trial, bounds)
            seed = draw_seed(cfg.seed, trial.number)
            rec = {"trial": trial.number, "seed": seed, **evaluate(target, spec, seed, cfg.grad)}
            if rec["status"] == "measured":
                rec["objective"] = objective(score(rec, cfg.grad))
                study.tell(trial, rec["objective"])
                if best is None or rec["objective"] > best["objective"]:
                    best = rec
            else:
                rec["objective"] = None
                study.tell(trial, state=(optuna.trial.TrialState.PRUNED
                                         if rec["status"] == "unsupported"
                                         else optuna.trial.TrialState.FAIL))
            rec["best_output_error"] = None if best is None else best["output_error"]
            if cfg.grad:
                rec["best_grad_error"] = None if best is None else best["grad_error"]
            rec["elapsed_s"] = before + (time.perf_counter() - t0)
            rec.update(params=dict(trial.params), spec=spec.as_dict())
            records.append(rec)
            if sink is not None:
                sink(rec)
            if progress is not None:
                progress(len(records), time.perf_counter() - t0, best)
    return summarize(records, cfg.threshold, before + (time.perf_counter() - t0), cfg.grad)


def summarize(records: list[dict], threshold: float, elapsed_s: float,
              grad: bool = False) -> HuntResult:
    """The worst case and the verdict of ``records`` (also of an interrupted hunt's; ``grad``:
    judged by the gradient errors)."""
    measured = [r for r in records if r["status"] == "measured"]
    worst = None
    for r in measured:
        if worst is None or r["objective"] > worst["objective"]:
            worst = r
    counts = {s: sum(r["status"] == s for r in records)
              for s in ("measured", "unsupported", "raised")}
    found = (counts["raised"] > 0
             or any(r["output_nonfinite"] or r["state_nonfinite"] or r.get("grad_nonfinite")
                    for r in measured)
             or (worst is not None and not score(worst, grad) <= threshold))
    return HuntResult(records=records, worst=worst, found=found, counts=counts,
                      elapsed_s=elapsed_s)

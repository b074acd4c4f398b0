"""``kdalab hunt``: search the input space for a kernel's largest error against fp64."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import STATE, Interrupted, app, console, prose

_EPILOG = (
    "TARGET: any kernel kdalab check takes: kdalab, kdalab-tf32, kdalab-fp32, kdalab-gluon, fla, "
    "fla-recurrent, flashkda "
    "(CUDA), recipe:NAME (a kdalab.kda recipe, e.g. recipe:flashkda, recipe:fp32; CPU or "
    "CUDA), module:function. Reproducibility: with --trials N (and no --budget-s) the same "
    "--seed gives the same trials and the same worst case, bit for bit (a deterministic target "
    "on the same machine); with a time budget the number of trials depends on the machine's "
    "speed, so the worst case may differ. --resume continues the hunt in --out (the same "
    "TARGET; options left out are the hunt's; --trials and --budget-s then count the trials "
    "this run adds, the reports cover all trials); a split hunt is reproducible for the same "
    "split, but differs from the unsplit one after the split. Exit codes: 0 nothing above "
    "--threshold, 1 an output "
    "error (--grad: a gradient error) above it (or a non-finite value, or a kernel that "
    "raised), 2 usage error. "
    "docs/hunt.md."
)

#: defaults by device: T, heads (a CPU evaluation stays well under a second)
_DEFAULTS = {"cpu": dict(min_T=16, max_T=256, max_heads=4),
             "cuda": dict(min_T=64, max_T=4096, max_heads=8)}


@app.command("hunt", epilog=_EPILOG, help=prose("""
    Search the input space for TARGET's largest output error against the fp64 recurrence: a
    seeded Optuna TPE search over one parametrized input generator (key collinearity and
    clusters, β, the gate's strength, A_log and dt_bias, v and initial-state scales, a hard
    block's place, T, H, the lower bound, the gate mode and strong decay). Writes worst.json,
    worst.safetensors (a check case), trials.jsonl, hunt.json, progress.png and report.md to
    --out."""))
def hunt_command(
    target: Annotated[str, typer.Argument(help="the kernel (see below)", show_default=False)],
    device: Annotated[Optional[str], typer.Option(
        help="cpu or cuda; default: cuda when available", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option(
        help="the search's seed (default 0)", show_default=False)] = None,
    budget_s: Annotated[Optional[float], typer.Option(
        "--budget-s", help="seconds to search (default 300, or no limit with --trials)",
        show_default=False)] = None,
    trials: Annotated[Optional[int], typer.Option(
        help="stop after this many trials (bit-reproducible with the same --seed)",
        show_default=False)] = None,
    threshold: Annotated[Optional[float], typer.Option(
        help="an output error above this is a finding; default: kdalab check's output "
             "threshold (1e-2)", show_default=False)] = None,
    min_t: Annotated[Optional[int], typer.Option(
        "--min-T", help="smallest sequence length (default 16 on cpu, 64 on cuda)",
        show_default=False)] = None,
    max_t: Annotated[Optional[int], typer.Option(
        "--max-T", help="largest sequence length (default 256 on cpu, 4096 on cuda)",
        show_default=False)] = None,
    min_heads: Annotated[Optional[int], typer.Option(
        "--min-heads", help="fewest heads (default 1)", show_default=False)] = None,
    max_heads: Annotated[Optional[int], typer.Option(
        "--max-heads", help="most heads (default 4 on cpu, 8 on cuda)",
        show_default=False)] = None,
    dims: Annotated[Optional[str], typer.Option(
        help="head dims K = V to choose from (those the target declares it cannot take are "
             "left out; default 64,128)", show_default=False)] = None,
    lower_bound: Annotated[Optional[str], typer.Option(
        help="the gate's lower bound: a number or a range LOW:HIGH (default -5:-1)",
        show_default=False)] = None,
    max_sequences: Annotated[Optional[int], typer.Option(
        "--max-sequences", help="most sequences per case (a batch, or packed along T; "
                                "default 2)", show_default=False)] = None,
    gates: Annotated[Optional[str], typer.Option(
        help="gate modes to search, comma-separated: lower_bound, unbounded (fla's softplus "
             "gate), log_decay (g the log-decay itself); those the target declares it cannot "
             "take are left out (default all three)", show_default=False)] = None,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/hunt"),
    force: Annotated[bool, typer.Option(
        "--force", help="write into --out even if it holds a hunt (started afresh) or files "
                        "that are not a hunt's (kept)")]
    = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue the hunt in --out (an error if it holds none): the same "
                         "TARGET; options left out are the hunt's, those given must match it; "
                         "--trials and --budget-s count what this run adds")]
    = False,
    grad: Annotated[bool, typer.Option(
        "--grad", help="hunt the worst gradient error (dq … dh0 against fp64's) instead of the "
                       "output's; the threshold then judges it (docs/training.md)")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress bar or summary")] = False,
) -> None:
    from kdalab import params
    from kdalab.cli.common import default_device
    from kdalab.cli.stored import refuse_resume_with_force
    from kdalab.errors import KdalabError
    from kdalab.hunt import HuntConfig, default_threshold, resolve
    from kdalab.hunt.files import (
        META,
        TrialWriter,
        prepare_folder,
        read_meta,
        resume_folder,
        write_meta,
    )
    from kdalab.hunt.search import summarize, supported_bounds
    from kdalab.records.identity import lock

    refuse_resume_with_force(resume, force)
    if resume:  # the options left out are the hunt's (those given are checked against it)
        saved = read_meta(out)
        try:
            b = saved["bounds"]
            device = saved["device"] if device is None else device
            seed, threshold = (saved[k] if x is None else x
                               for k, x in (("seed", seed), ("threshold", threshold)))
            grad = grad or saved.get("grad", False)
            min_t, max_t, min_heads, max_heads, max_sequences = (
                b[k] if x is None else x for k, x in (
                    ("min_T", min_t), ("max_T", max_t), ("min_heads", min_heads),
                    ("max_heads", max_heads), ("max_sequences", max_sequences)))
            dims = ",".join(map(str, b["dims"])) if dims is None else dims
            lower_bound = ":".join(map(repr, b["lower_bound"])) if lower_bound is None else (
                lower_bound)
            # a hunt from before the gate knob searched the lower-bound gate alone
            gates = ",".join(b.get("gates", ["lower_bound"])) if gates is None else gates
        except (KeyError, TypeError) as exc:  # a hunt.json edited or cut by hand
            raise ValueError(f"--resume: '{out}/hunt.json' is not a hunt's description "
                             f"({type(exc).__name__}: {exc})") from None
    device = params.device(default_device() if device is None else device, "--device")
    kind = "cuda" if device.startswith("cuda") else "cpu"
    bounds = _bounds(_DEFAULTS[kind], min_t, max_t, 1 if min_heads is None else min_heads,
                     max_heads, "64,128" if dims is None else dims,
                     "-5:-1" if lower_bound is None else lower_bound,
                     2 if max_sequences is None else max_sequences, gates)
    if budget_s is None and trials is None:
        budget_s = 300.0
    cfg = _renamed(lambda: HuntConfig(
        target=target, device=device, seed=0 if seed is None else seed, trials=trials,
        budget_s=budget_s,
        threshold=default_threshold() if threshold is None else threshold, bounds=bounds,
        grad=grad))
    _fits(bounds, device)
    tgt = resolve(target, device, grad)
    try:
        cfg_bounds = supported_bounds(cfg.bounds, tgt)
    except ValueError as exc:
        raise params.renamed(exc, {"dims": "--dims", "gates": "--gates",
                                   "lower_bound": "--lower-bound"}) from None
    history: list[dict] = []
    path = params.user_path(out, "--out")
    # one hunt at a time in a folder: another one writing it is refused, not interleaved
    held = lock(path) if resume or (path / META).is_file() else None
    try:
        if resume:
            folder, before, history = resume_folder(out, cfg)
        else:
            existed = path.exists()
            folder, before = prepare_folder(out, force=force), {}
            held = lock(folder) if held is None else held
        run = {"command": " ".join(["kdalab", *sys.argv[1:]]) if sys.argv[1:2] == ["hunt"]
               else f"kdalab hunt {target}",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
               "device_name": _device_name(device)}
        # the first run's command and date stay on top; every run (its limits, the trial it began
        # at) is listed under "runs"
        meta = {**run, **{k: before[k] for k in run if k in before}, **cfg.as_dict(),
                "searched_bounds": cfg_bounds.as_dict(),
                "runs": [*before.get("runs", []), {**run, "trials": cfg.trials,
                                                   "budget_s": cfg.budget_s,
                                                   "first_trial": len(history)}]}
        write_meta(folder, meta)
        writer = TrialWriter(folder)
        records: list[dict] = list(history)

        def sink(rec):
            records.append(rec)
            writer(rec)

        try:
            result = _search(cfg, tgt, sink, quiet, history)
        except (ValueError, KdalabError) as exc:  # a mistake said before any trial (a kernel
            writer.close()  # that breaks the convention, trials that do not replay): taken back
            if not resume and not records:
                _take_back(folder, existed)
            elif resume and len(records) == len(history):
                write_meta(folder, before)  # the hunt as it was: no run of this one listed
            raise params.renamed(exc, {"resume": "--resume"}) from None
        except Interrupted:
            writer.close()
            elapsed = records[-1]["elapsed_s"] if records else 0.0
            _finish(folder, summarize(records, cfg.threshold, elapsed, cfg.grad), cfg, meta,
                    quiet=True)
            STATE.kept.append(f"{len(records)} trials and the worst so far in {folder}/")
            STATE.resume = f"'kdalab hunt {target} --out {folder} --resume' continues the hunt"
            raise
        writer.close()
        _finish(folder, result, cfg, meta, quiet=quiet)
        if result.found:
            raise typer.Exit(code=1)
    finally:
        if held is not None:
            os.close(held)


def _take_back(folder: Path, existed: bool) -> None:
    """Remove the files a new hunt wrote in ``folder`` before its first trial, and the folder
    itself when this run made it (a mistake leaves nothing behind)."""
    from kdalab.hunt.files import OWN
    from kdalab.records.identity import LOCK

    for name in (*OWN, LOCK):
        (folder / name).unlink(missing_ok=True)
    if not existed:
        try:
            folder.rmdir()
        except OSError:  # something else is in it now: left as it is
            pass


def _gates(text: str | None) -> tuple[str, ...]:
    from kdalab.hunt.space import GATES

    if text is None:
        return GATES
    gates = tuple(g.strip() for g in text.split(",") if g.strip())
    if not gates or any(g not in GATES for g in gates):
        raise ValueError(f"--gates must be some of {', '.join(GATES)} (comma-separated), got "
                         f"{text!r}")
    return gates


def _bounds(d, min_t, max_t, min_heads, max_heads, dims, lower_bound, max_sequences, gates):
    from kdalab.hunt import Bounds

    names = {"min_T": "--min-T", "max_T": "--max-T", "min_heads": "--min-heads",
             "max_heads": "--max-heads", "max_sequences": "--max-sequences", "dims": "--dims",
             "lower_bound": "--lower-bound"}
    try:
        return Bounds(min_T=d["min_T"] if min_t is None else min_t,
                      max_T=d["max_T"] if max_t is None else max_t, min_heads=min_heads,
                      max_heads=d["max_heads"] if max_heads is None else max_heads,
                      dims=dims, lower_bound=lower_bound, max_sequences=max_sequences,
                      gates=_gates(gates))
    except ValueError as exc:
        text = str(exc)
        for field, option in names.items():  # the fields as the options name them
            text = text.replace(field, option)
        raise ValueError(text) from None


#: bytes per element of the largest case's tensors, all copies together: the draw (fp32), its
#: fp64 reference (inputs, the state per step, the output) and the kernel's output and state;
#: a generous round figure, so that a case refused would not have fit.
_BYTES_PER_ELEMENT = 48


def _fits(bounds, device: str) -> None:
    """A ValueError naming the bounds' options when the largest case they allow (every bound at
    its maximum) could not be held in this device's memory: refused before any file is made,
    instead of failing on the first large trial."""
    import os

    import torch

    n, t, h, d = bounds.max_sequences, bounds.max_T, bounds.max_heads, max(bounds.dims)
    elements = n * h * (4 * t * d + 2 * d * d)  # q, k, v, g over T; the initial and final state
    need = elements * _BYTES_PER_ELEMENT
    if device.startswith("cuda"):
        have = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ValueError(f"--max-T {t}, --max-heads {h}, --max-sequences {n} and --dims up to {d}: "
                         f"the largest case needs about {need / 2**30:,.0f} GiB, more than the "
                         f"{have / 2**30:,.0f} GiB of {device}; lower them")


def _renamed(make):
    from kdalab import params

    try:
        return make()
    except ValueError as exc:
        raise params.renamed(exc, {"budget_s": "--budget-s", "trials": "--trials",
                                   "threshold": "--threshold", "seed": "--seed"}) from None


def _device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()})"


def _search(cfg, target, sink, quiet, history):
    from kdalab.cli.progress import WeightedProgress
    from kdalab.hunt import run_hunt
    from kdalab.hunt.evaluate import score
    from kdalab.views.tables import fmt_sci

    by_time = cfg.trials is None
    total = cfg.budget_s if by_time else cfg.trials
    with WeightedProgress("trials", None if by_time else cfg.trials, total, quiet,
                          what="hunt") as bar:

        what = "gradient" if cfg.grad else "output"

        def progress(n, seconds, best):
            worst = "—" if best is None else fmt_sci(score(best, cfg.grad))
            bar.update(items=n - len(history), done=seconds if by_time else n - len(history),
                       note=f"worst {what} error {worst}")

        return run_hunt(cfg, sink=sink, progress=progress, target=target, history=history)


def _floor_note(worst: dict) -> str:
    """`` (N x its floor F)`` for a --grad hunt's worst gradient, where its floor is known."""
    from kdalab.views.tables import fmt_sci

    floor = worst.get(f"{worst['worst_grad']}_floor_error")
    if not floor:
        return ""
    return f" ({worst['grad_floor_multiple']:.3g}x its floor {fmt_sci(floor)})"


def _finish(folder, result, cfg, meta, *, quiet):
    from kdalab.hunt.files import write_results
    from kdalab.views.hunt import write_hunt_views
    from kdalab.views.tables import fmt_sci

    paths = write_results(folder, result, cfg, meta)
    full = json.loads((folder / "hunt.json").read_text(encoding="utf-8"))
    worst_file = folder / "worst.json"  # as written, with a --grad hunt's floors
    worst = (json.loads(worst_file.read_text(encoding="utf-8")) if result.worst is not None
             else None)
    paths += write_hunt_views(result.records, full, worst, folder)
    if quiet:
        return
    c = result.counts
    console.print(f"{cfg.target} on {meta['device_name']}: {len(result.records)} trials "
                  f"({c['measured']} measured, {c['unsupported']} unsupported, {c['raised']} "
                  f"raised) in {result.elapsed_s:.0f} s", highlight=False, soft_wrap=True)
    if worst is not None:
        console.print(f"worst: trial {worst['trial']}, output error "
                      f"{fmt_sci(worst['output_error'])}, state error "
                      f"{fmt_sci(worst['state_error'])}, non-finite {worst['output_nonfinite']} "
                      f"(output) / {worst['state_nonfinite']} (state)"
                      + (f"; worst gradient {worst['worst_grad']} {fmt_sci(worst['grad_error'])}"
                         + _floor_note(worst) if cfg.grad else ""),
                      highlight=False, soft_wrap=True)
    verdict = ("[bold red]FOUND[/]: above the threshold " if result.found
               else "[bold green]nothing[/] above the threshold ")
    console.print(f"{verdict}{fmt_sci(cfg.threshold)}; wrote {', '.join(p.name for p in paths)} "
                  f"to {folder}/", highlight=False, soft_wrap=True)

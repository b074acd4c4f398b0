"""The views of a ``kdalab hunt``, drawn from its trial records, its run description (hunt.json)
and its worst case (worst.json) only: the progress plot (output error against evaluations, the
best so far, the threshold) and a short Markdown report. A ``--grad`` hunt's (``"grad"`` in
hunt.json) show the worst gradient error where an output hunt's show the output error."""

from __future__ import annotations

import math
from pathlib import Path

from kdalab.views.tables import fmt_sci

__all__ = ["plot_progress", "markdown_report", "write_hunt_views"]


def _err(x) -> float:
    return math.nan if x is None else float(x)


def _scored(meta: dict) -> tuple[str, str]:
    """The record field a hunt is judged by, and its name in words."""
    return ("grad_error", "worst gradient error") if meta.get("grad") else (
        "output_error", "output error")


def plot_progress(records: list[dict], meta: dict, folder: str | Path) -> list[Path]:
    """progress.png and progress.svg: each measured trial's output error (non-finite ones as
    'x' on the top edge), the best so far, the threshold; trials not measured as ticks at the
    bottom."""
    import matplotlib.pyplot as plt

    from kdalab.views.plots import plot_series_with_nonfinite, save_figure

    fig, ax = plt.subplots(figsize=(7.0, 4.0), layout="constrained")
    field, words = _scored(meta)
    measured = [r for r in records if r["status"] == "measured"]
    x = [r["trial"] for r in measured]
    plot_series_with_nonfinite(ax, x, [_err(r[field]) for r in measured],
                               label=f"{words} of the trial", linestyle="none",
                               markersize=3.5, alpha=0.7)
    best_key = f"best_{field}"
    best = [(r["trial"], _err(r[best_key])) for r in records
            if r.get(best_key) is not None and math.isfinite(r[best_key])]
    if best:
        ax.step([b[0] for b in best], [b[1] for b in best], where="post", color="black",
                linewidth=1.2, label="worst so far")
    ax.axhline(meta["threshold"], color="tab:red", linestyle="--", linewidth=1,
               label=f"threshold {fmt_sci(meta['threshold'])}")
    other = [r["trial"] for r in records if r["status"] != "measured"]
    if other:
        ax.plot(other, [0.0] * len(other), "|", color="gray", transform=ax.get_xaxis_transform(),
                markersize=8, label="unsupported or raised")
    for i, run in enumerate(meta.get("runs", [])[1:]):  # where each resumed run began
        ax.axvline(run["first_trial"] - 0.5, color="gray", linestyle=":", linewidth=1,
                   label="resumed" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation (trial)")
    ax.set_ylabel(f"{words} (rel. RMSE vs fp64)")
    ax.set_title(f"kdalab hunt {meta['target']} on {meta.get('device_name', meta['device'])}, "
                 f"seed {meta['seed']}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, folder, "progress")


def _spec_rows(spec: dict) -> list[str]:
    return [f"| `{k}` | {'—' if v is None else v} |" for k, v in spec.items()]


def _gate(spec: dict) -> str:
    """The gate of a trial's spec, short: ``lb -1.5``, ``unbounded``, ``log-decay`` (with
    ``, strong`` where a decay range was drawn)."""
    lb = spec["lower_bound"]
    name = ("log-decay" if spec.get("g_as_log_decay") else
            "unbounded" if lb is None else f"lb {lb:.3g}")
    return name + (", strong" if spec.get("decay_range") else "")


def _runs(meta: dict) -> list[str]:
    """The report's line on a resumed hunt's runs (none for a hunt run once): the limits of the
    budget and trials above are the last run's."""
    runs = meta.get("runs", [])
    if len(runs) < 2:
        return []
    def limits(r: dict) -> str:
        budget = f"budget {r['budget_s']:g} s" if r.get("budget_s") else "no time limit"
        return f"{budget}, " + (f"{r['trials']} trials" if r.get("trials") else "no trial limit")

    each = "; ".join(f"{r['date']} from trial {r['first_trial']} ({limits(r)})" for r in runs)
    return [f"- {len(runs)} runs (resumed with --resume; budget and trials above: the last "
            f"run's, each counting what it added): {each}"]


def markdown_report(records: list[dict], meta: dict, worst: dict | None) -> str:
    """report.md: the verdict, the worst case (errors, knobs, how to replay it), the five worst
    trials and what was not measured."""
    counts = meta.get("counts", {})
    field, words = _scored(meta)
    verdict = "FOUND" if meta.get("found") else "nothing found"
    lines = [f"# kdalab hunt {meta['target']}", "",
             f"`{meta.get('command', '')}`", "",
             f"- device: {meta.get('device_name', meta['device'])}",
             f"- seed {meta['seed']}; {meta.get('trials_run', len(records))} trials in "
             f"{meta.get('elapsed_s', '?')} s (budget: "
             f"{meta['budget_s'] if meta.get('budget_s') else 'none'} s, trials: "
             f"{meta['trials'] if meta.get('trials') else 'no limit'})",
             *_runs(meta),
             f"- measured {counts.get('measured', 0)}, declared unsupported "
             f"{counts.get('unsupported', 0)}, raised {counts.get('raised', 0)}",
             f"- sampler: {meta.get('sampler', '?')}",
             f"- threshold ({words}): {fmt_sci(meta['threshold'])}", "",
             f"**Verdict: {verdict}.**", ""]
    first = next((r for r in records if r["status"] == "measured"
                  and not r[field] <= meta["threshold"]), None)
    if first is not None:
        lines += [f"The first trial above the threshold: trial {first['trial']} ({words} "
                  f"{fmt_sci(first[field])}), {first.get('elapsed_s', math.nan):.1f} s "
                  f"into the hunt.", ""]
    if worst is not None:
        lines += [
            "## The worst case", "",
            f"Trial {worst['trial']}: output error **{fmt_sci(worst['output_error'])}**, "
            f"final-state error {fmt_sci(worst['state_error'])}, non-finite values: "
            f"{worst['output_nonfinite']} in the output, {worst['state_nonfinite']} in the "
            f"state (bf16 floor of this output: {fmt_sci(worst['bf16_floor'])}).", "",
            *_worst_gradients(worst),
            "Rebuild it: `kdalab.inputs.sequences.draw(SequenceSpec.from_dict(spec), "
            f"{worst['seed']})` with the spec below (worst.json), or replay the case file: "
            f"`kdalab check {meta['target']}{' --grad' if meta.get('grad') else ''} --inputs "
            "worst.safetensors`.", "",
            "| knob | value |", "|---|---|", *_spec_rows(worst["spec"]), ""]
    measured = sorted((r for r in records if r["status"] == "measured"),
                      key=lambda r: (-r["objective"], r["trial"]))[:5]
    if measured:
        lines += ["## The five worst trials", "",
                  f"| trial | {'worst gradient | ' if meta.get('grad') else ''}output error "
                  "| state error | T | H | K | gate | key clusters | key eps | β logit "
                  "| raw gate mean |", "|" + "---|" * (12 if meta.get("grad") else 11)]
        for r in measured:
            s = r["spec"]
            grad = (f"{r['worst_grad']} {fmt_sci(r['grad_error'])} | " if meta.get("grad")
                    else "")
            lines.append(
                f"| {r['trial']} | {grad}{fmt_sci(r['output_error'])} | "
                f"{fmt_sci(r['state_error'])} "
                f"| {s['T']} | {s['heads']} | {s['K']} | {_gate(s)} "
                f"| {s['key_clusters']} | {s['key_eps']:.3g} | {s['beta_mean']:.3g} "
                f"| {s['g_mean']:.3g} |")
        lines.append("")
    others = [r for r in records if r["status"] != "measured"]
    if others:
        lines += ["## Not measured", ""]
        lines += [f"- trial {r['trial']}: {r['status']}: {r['message']}" for r in others[:10]]
        if len(others) > 10:
            lines.append(f"- … and {len(others) - 10} more (trials.jsonl)")
        lines.append("")
    lines += ["Files: hunt.json (the run), trials.jsonl (every trial), worst.json, "
              "worst.safetensors (the worst case), progress.png / .svg. docs/hunt.md explains "
              "the knobs and the search.", ""]
    return "\n".join(lines)


def _worst_gradients(worst: dict) -> list[str]:
    """The worst case's gradient errors (a ``--grad`` hunt's), as one line."""
    if worst.get("grad_error") is None:
        return []
    each = ", ".join(f"{k.removesuffix('_error')} {fmt_sci(v)}" for k, v in worst.items()
                     if k.startswith("d") and k.endswith("_error") and not
                     k.endswith("_floor_error") and v is not None)  # dq … dh0
    lines = [f"Gradients (relative error against the fp64 reference's, upstream dO and dHT "
             f"drawn from the case's seed): worst **{worst['worst_grad']} "
             f"{fmt_sci(worst['grad_error'])}**; {each}; non-finite: "
             f"{worst['grad_nonfinite']}.", ""]
    floors = {k.removesuffix("_floor_error"): v for k, v in worst.items()
              if k.endswith("_floor_error") and v is not None}
    if floors:
        mult = worst.get("grad_floor_multiple")
        lines += ["Their floors on this case (the float32 token recurrence's gradients, rounded "
                  "to bf16, against the fp64 reference's): "
                  + ", ".join(f"{n} {fmt_sci(v)}" for n, v in floors.items())
                  + (f"; the worst gradient at **{mult:.3g}x its floor**" if mult is not None
                     else "") + " (check --grad's floors: docs/training.md).", ""]
    return lines


def write_hunt_views(records: list[dict], meta: dict, worst: dict | None,
                     folder: str | Path) -> list[Path]:
    """Every view of a hunt's folder: progress.png / .svg (when a trial was measured) and
    report.md."""
    folder = Path(folder)
    paths = []
    if any(r["status"] == "measured" for r in records):
        paths += plot_progress(records, meta, folder)
    (folder / "report.md").write_text(markdown_report(records, meta, worst), encoding="utf-8")
    return paths + [folder / "report.md"]

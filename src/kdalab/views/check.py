"""Views of a ``kdalab check`` run, drawn from its records (and the run's description) only: the
terminal table (kernel × case, failures highlighted), the error plot (per case per kernel, the
bf16 floor and the thresholds drawn); the Markdown and HTML reports are in
:mod:`kdalab.views.check_report`."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kdalab.views.tables import fmt_sci  # noqa: E402

__all__ = ["kernels_of", "cases_of", "summary", "cell_text", "terminal_table", "notes",
           "plot_check", "verdict", "contract_rows", "gradients_of", "worst_gradient",
           "gradient_rows"]

_STATUS_MARK = {"pass": "✓", "fail": "✗", "unsupported": "–", "skipped": "·", "excluded": "·"}


def _frame(records) -> pd.DataFrame:
    return records if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(records)


def _ordered(df: pd.DataFrame, column: str) -> list[str]:
    return list(dict.fromkeys(df[column].tolist()))


def kernels_of(records) -> list[str]:
    return _ordered(_frame(records), "kernel")


def cases_of(records) -> list[str]:
    return _ordered(_frame(records), "case")


def _mode(df: pd.DataFrame) -> str:
    return str(df["mode"].iloc[0]) if len(df) else "fp64"


def _num(x) -> float:
    return math.nan if x is None else float(x)


def cell_text(rec: dict) -> str:
    """A (kernel, case) cell: output / state error (fp64 mode) or identical-bit percentage /
    worst relative difference (fidelity mode); ``unsupported`` otherwise."""
    if rec["status"] in ("unsupported", "skipped", "excluded"):
        return rec["status"]
    if rec["status"] == "fail" and str(rec["message"]).startswith("crashed"):
        return "crashed"
    if rec["mode"] == "fidelity":
        return (f"{100 * _num(rec['o_identical']):.2f}% / "
                f"{fmt_sci(_num(rec['o_worst_rel_diff']))}")
    if rec.get("kind") in ("causal", "layout"):  # the outputs' bits, and the gradients'
        diff = max((d for d in (_num(rec.get("contract_max_diff")),
                                _num(rec.get("grad_contract_max_diff"))) if not math.isnan(d)),
                   default=math.nan)
        return ("bit-identical" if rec["status"] == "pass"
                else f"changed by {fmt_sci(diff)}" if diff > 0 else rec["status"])
    text = f"{fmt_sci(_num(rec['o_rel_err']))} / {fmt_sci(_num(rec['state_rel_err']))}"
    worst = _worst_multiple(rec)
    text = text if math.isnan(worst) else f"{text} ({_fmt_multiple(worst)})"
    name, mult = worst_gradient(rec)
    return f"{text}; ∇ {name} {_fmt_multiple(mult)}" if name else text


def gradients_of(records) -> list[str]:
    """The gradients a ``--grad`` run's records judge (dq … dh0), in the records' order, read
    from their fields (none for a forward-only run)."""
    fields = records.columns if isinstance(records, pd.DataFrame) else (
        records[0] if len(records) else {})
    return [f.removesuffix("_budget_multiple") for f in fields
            if f.endswith("_budget_multiple") and f not in ("o_budget_multiple",
                                                            "state_budget_multiple")]


def worst_gradient(rec: dict) -> tuple[str, float]:
    """The gradient with the largest multiple of its floor and that multiple (``--grad``
    records), or ``("", nan)``."""
    mults = [(n, _num(rec.get(f"{n}_budget_multiple"))) for n in gradients_of([rec])]
    mults = [(n, m) for n, m in mults if not math.isnan(m)]
    return max(mults, key=lambda p: p[1]) if mults else ("", math.nan)


def gradient_rows(records) -> list[dict]:
    """The gradient table (``--grad``): per case whose gradients were judged, a ``floor`` row
    (each gradient's floor error) and one row per kernel that ran: ``case``, ``kernel``,
    ``status`` and per gradient ``(relative error, multiple of the floor)`` (NaN: not judged)."""
    df = _frame(records)
    names = gradients_of(df)
    if not names:
        return []
    ran = df[df["status"].isin(("pass", "fail")) & df[f"{names[0]}_rel_err"].notna()]
    ran = ran.to_dict("records")
    rows = []
    for case in dict.fromkeys(r["case"] for r in ran):
        mine = [r for r in ran if r["case"] == case]
        rows.append({"case": case, "kernel": "floor", "status": "",
                     **{n: (_num(mine[0].get(f"{n}_floor_err")), math.nan) for n in names}})
        rows += [{"case": case, "kernel": r["kernel"], "status": r["status"],
                  **{n: (_num(r.get(f"{n}_rel_err")), _num(r.get(f"{n}_budget_multiple")))
                     for n in names}} for r in mine]
    return rows


def _fmt_multiple(m: float) -> str:
    if math.isinf(m):
        return "inf×"
    return f"{m:.1f}×" if m < 1e3 else f"{fmt_sci(m)}×"


def _worst_multiple(rec: dict) -> float:
    """The larger of the output's and the state's multiples of the floor (NaN if none)."""
    vals = [_num(rec.get(k)) for k in ("o_budget_multiple", "state_budget_multiple")]
    vals = [v for v in vals if not math.isnan(v)]
    return max(vals) if vals else math.nan


def verdict(records, complete: bool = True) -> tuple[bool, str]:
    """``(passed, one line)``: a run passes when it is complete, no case failed or was skipped
    after a crash, and every kernel ran at least one case (no pass without a run). The line
    says how many (kernel, case) pairs ran."""
    df = _frame(records)
    count = df["status"].value_counts()
    n = {k: int(count.get(k, 0)) for k in ("pass", "fail", "skipped", "unsupported",
                                            "excluded")}
    ran = n["pass"] + n["fail"]
    idle = [k for k in kernels_of(df)
            if not df[(df["kernel"] == k) & df["status"].isin(("pass", "fail"))].shape[0]]
    passed = complete and not n["fail"] and not n["skipped"] and not idle
    parts = [f"{ran} of {len(df)} (kernel, case) pairs ran: {n['pass']} passed, "
             f"{n['fail']} failed"]
    if n["skipped"]:
        parts.append(f"{n['skipped']} not run after a crash")
    parts.append(f"{n['unsupported']} unsupported")
    if n["excluded"]:
        parts.append(f"{n['excluded']} excluded")
    if idle:
        parts.append(f"no case ran for {', '.join(idle)} (a kernel that runs nothing fails)")
    if not complete:
        parts.append("INCOMPLETE: the run was interrupted")
    return passed, ("PASS: " if passed else "FAIL: ") + "; ".join(parts)


def contract_rows(records) -> list[dict]:
    """One row per (contract case, kernel) that ran: case, kernel, status, what was compared,
    the largest difference (of the outputs and states; ``grad max diff``: of the gradients,
    under ``--grad``) and the worst multiple of the floor."""
    df = _frame(records)
    if "kind" not in df:
        return []
    sel = df[(df["kind"] != "accuracy") & df["status"].isin(("pass", "fail"))]
    return [{"case": r["case"], "kernel": r["kernel"], "status": r["status"],
             "compared": r.get("contract_compared") or "",
             "max diff": _num(r.get("contract_max_diff")),
             "grad max diff": _num(r.get("grad_contract_max_diff")),
             "x floor": _worst_multiple(r), "message": r["message"]}
            for r in sel.to_dict("records")]


def summary(records) -> pd.DataFrame:
    """One row per kernel: counts of passed, failed and unsupported cases, and the worst and
    median output error (or identical fraction) over the supported ones."""
    df = _frame(records)
    rows = []
    value = "o_identical" if _mode(df) == "fidelity" else "o_rel_err"
    for kernel in kernels_of(df):
        k = df[df["kernel"] == kernel]
        ran = k[k["status"].isin(("pass", "fail"))]
        vals = ran[value].astype(float).to_numpy()
        vals = vals[~np.isnan(vals)]
        row = {"kernel": kernel, "cases": len(k), "pass": int((k["status"] == "pass").sum()),
               "fail": int((k["status"] == "fail").sum()),
               "unsupported": int((k["status"] == "unsupported").sum()),
               "not run": int((k["status"] == "skipped").sum()),
               "excluded": int((k["status"] == "excluded").sum())}
        row["ran"] = row["pass"] + row["fail"]
        if value == "o_rel_err":
            row["worst output error"] = float(np.max(vals)) if len(vals) else math.nan
            mult = np.array([_worst_multiple(r) for r in ran.to_dict("records")], dtype=float)
            mult = mult[~np.isnan(mult)]
            row["median × floor"] = float(np.median(mult)) if len(mult) else math.nan
            row["worst × floor"] = float(np.max(mult)) if len(mult) else math.nan
            if gradients_of(df):
                grads = [worst_gradient(r)[1] for r in ran.to_dict("records")]
                grads = [g for g in grads if not math.isnan(g)]
                row["worst ∇ × floor"] = max(grads) if grads else math.nan
        else:
            row["lowest identical"] = float(np.min(vals)) if len(vals) else math.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    for column in ("not run", "excluded"):  # only when a kernel crashed / was excluded
        if len(out) and not out[column].any():
            out = out.drop(columns=column)
    return out


_FLOOR = "o_floor_err"


def _levels(ax, x: np.ndarray, values: np.ndarray, **style) -> None:
    """A short horizontal line at each case's level (floor, budget, threshold), where the level
    can be drawn on a log axis: positive and finite; past 1e100 (a budget of 1e308) it is off
    any chart, and matplotlib's log transform overflows on it."""
    ok = np.isfinite(values) & (values > 0) & (values < 1e100)
    if ok.any():
        ax.hlines(values[ok], (x - 0.4)[ok], (x + 0.4)[ok], **style)


def _case_floor(df: pd.DataFrame, case: str, column: str = "bf16_floor") -> float:
    """The case's bf16 floor (the same in every record that has it: a property of the case)."""
    if column not in df:
        return math.nan
    values = df[df["case"] == case][column].dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def notes(records) -> list[str]:
    """One line per (kernel, status, message) with the cases it covers, failures first; then
    what each kernel gave on the poisoned sequences of the non-finite cases."""
    df = _frame(records)
    out = []
    for status in ("fail", "skipped", "unsupported", "excluded"):
        sel = df[df["status"] == status]
        for kernel in kernels_of(sel) if len(sel) else []:
            k = sel[sel["kernel"] == kernel]
            for message, g in k.groupby("message", sort=False):
                out.append(f"{kernel} — {status} on {', '.join(g['case'])}: {message}")
    if "o_nonfinite_all" in df:
        ran = df[(df["poison"] != "") & df["o_nonfinite_all"].notna() & df["o_nonfinite"].notna()]
        for rec in ran.to_dict("records"):  # a kernel that raised gave no output to count
            bad = int(rec["o_nonfinite_all"]) - int(rec["o_nonfinite"])
            out.append(f"{rec['kernel']} — {rec['case']} ({rec['poison']}): {bad} non-finite "
                       f"outputs in the poisoned sequence (recorded, not judged)")
    return out


def terminal_table(records, title: str = ""):
    """A rich Table: one row per case, one column per kernel (failures in red)."""
    from rich.table import Table

    df = _frame(records)
    fidelity = _mode(df) == "fidelity"
    table = Table(title=title or None, title_justify="left")
    table.add_column("case", no_wrap=True)
    if not fidelity:
        table.add_column("floor", justify="right")
    kernels = kernels_of(df)
    for kernel in kernels:
        table.add_column(kernel + ("\nidentical / worst" if fidelity else "\no / state"),
                         justify="right")
    for case in cases_of(df):
        c = df[df["case"] == case].set_index("kernel")
        row = [case] + ([] if fidelity else [fmt_sci(_case_floor(df, case, _FLOOR))])
        for kernel in kernels:
            rec = c.loc[kernel].to_dict() | {"kernel": kernel} if kernel in c.index else None
            if rec is None:
                row.append("")
                continue
            text = cell_text(rec)
            style = {"fail": "bold red", "unsupported": "dim yellow", "skipped": "dim red",
                     "excluded": "dim"}.get(rec["status"], "")
            mark = _STATUS_MARK[rec["status"]]
            row.append(f"[{style}]{mark} {text}[/]" if style else f"{mark} {text}")
        table.add_row(*row)
    return table


# -- the plot ---------------------------------------------------------------------------------

def plot_check(records) -> bytes:
    """The error plot as PNG bytes: per case (x) per kernel (markers), output and state panels;
    the bf16 floor as black bars and the thresholds as dashed lines. Non-finite results are
    ``x`` markers on the top edge, unsupported ones are left out (the tables name them)."""
    df = _frame(records)
    fidelity = _mode(df) == "fidelity"
    cases, kernels = cases_of(df), kernels_of(df)
    if fidelity:
        panels = [("o_identical", "output elements not bit-identical", lambda v: 1 - v),
                  ("o_worst_rel_diff", "worst relative difference  max|a−b| / max|b|", None)]
    else:
        panels = [("o_rel_err", "output relative error vs fp64", None),
                  ("state_rel_err", "final-state relative error vs fp64", None)]
        if gradients_of(df):  # --grad: each record's worst gradient, as a multiple
            df = df.assign(grad_worst=[worst_gradient(r)[1] for r in df.to_dict("records")])
            panels.append(("grad_worst", "worst gradient error / its floor", None))
    width = max(8.0, 0.42 * len(cases) + 2.5)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.6 * len(panels)), sharex=True,
                             squeeze=False)
    x = np.arange(len(cases))
    colors = plt.get_cmap("tab10")
    offsets = np.linspace(-0.25, 0.25, len(kernels)) if len(kernels) > 1 else [0.0]
    for ax, (column, label, transform) in zip(axes[:, 0], panels):
        for i, kernel in enumerate(kernels):
            k = df[(df["kernel"] == kernel) & df["status"].isin(("pass", "fail"))
                   & df[column].notna()]  # a crashed case has nothing to draw
            pos = np.array([cases.index(c) for c in k["case"]], dtype=float) + offsets[i]
            y = k[column].astype(float).to_numpy()
            if transform is not None:
                y = transform(y)
            fail = (k["status"] == "fail").to_numpy()
            good = np.isfinite(y) & (y > 0)
            color = colors(i % 10)
            ax.scatter(pos[good & ~fail], y[good & ~fail], marker="o", color=color, s=28,
                       label=kernel if (good & ~fail).any() else None, zorder=3)
            ax.scatter(pos[good & fail], y[good & fail], marker="o", facecolors="none",
                       edgecolors=color, linewidths=1.6, s=40, zorder=3,
                       label=f"{kernel} (failed)" if (good & fail).any() else None)
            bad = ~np.isfinite(y)
            if bad.any():
                ax.scatter(pos[bad], np.ones(bad.sum()), marker="x", s=50, color=color,
                           transform=ax.get_xaxis_transform(), clip_on=False, zorder=4,
                           label=f"{kernel}: non-finite")
            zero = np.isfinite(y) & (y <= 0)
            if zero.any():  # exact (fidelity: every bit identical): on the bottom edge
                ax.scatter(pos[zero], np.zeros(zero.sum()), marker="v", s=30, color=color,
                           transform=ax.get_xaxis_transform(), clip_on=False, zorder=4,
                           label=f"{kernel}: exact" if not fidelity else
                           f"{kernel}: all identical")
        idle = df[~df["status"].isin(("pass", "fail")) | df[column].isna()]
        if len(idle):  # unsupported, excluded, crashed: a grey tick on the bottom edge
            pos = [cases.index(c) + offsets[kernels.index(k)]
                   for c, k in zip(idle["case"], idle["kernel"])]
            ax.scatter(pos, np.zeros(len(pos)), marker="|", s=60, color="grey",
                       transform=ax.get_xaxis_transform(), clip_on=False, zorder=4,
                       label="no error to draw (unsupported, excluded, crashed, bitwise contract)")
        if column == "grad_worst":
            ax.axhline(float(df["budget"].iloc[0]), color="red", linestyle="--", linewidth=1,
                       label="budget")
        elif not fidelity:
            floor_col = "o_floor_err" if column == "o_rel_err" else "state_floor_err"
            floor_col = floor_col if floor_col in df else "bf16_floor"
            floors = np.array([_case_floor(df, c, floor_col) for c in cases], dtype=float)
            _levels(ax, x, floors, colors="black", linewidth=1.6,
                    label="floor (fp32 recurrence on the same inputs, rounded)", zorder=2)
            if "budget" in df:
                _levels(ax, x, floors * float(df["budget"].iloc[0]), colors="red",
                        linestyles="--", linewidth=1, label="budget (multiple of the floor)")
            limit = df.get("max_output_error" if column == "o_rel_err" else "max_state_error")
            if limit is not None and limit.notna().any():
                _levels(ax, x, np.full(len(x), float(limit.dropna().iloc[0])), colors="red",
                        linestyles=":", linewidth=1, label="absolute threshold")
        else:
            if column == "o_identical":
                ax.axhline(1 - float(df["min_identical"].iloc[0]), color="red", linestyle="--",
                           linewidth=1, label="threshold")
        if not np.isfinite(ax.dataLim.minposy):  # nothing positive and finite drawn (every
            ax.set_ylim(1e-8, 1.0)  # error non-finite or exact): a log axis all the same
        ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(True, which="major", axis="y", alpha=0.3)
        for edge in x[1:] - 0.5:
            ax.axvline(edge, color="grey", alpha=0.15, linewidth=0.8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax = axes[-1, 0]
    ax.set_xticks(x)
    ax.set_xticklabels(cases, rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    title = (f"fidelity against {df['against'].iloc[0]}" if fidelity
             else "error against the fp64 token recurrence")
    fig.suptitle(f"kdalab check — {title} (x on the top edge: non-finite)", fontsize=10,
                 y=0.995)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# -- reports --------------------------------------------------------------------------------

"""The reports of a ``kdalab check`` run, drawn from its records (and the run's description)
only: a Markdown report and one self-contained HTML report with the plot embedded; and
:func:`write_check_views`, which writes every view of a run folder."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from kdalab.views.check import (
    _FLOOR,
    _STATUS_MARK,
    _case_floor,
    _frame,
    _mode,
    cases_of,
    cell_text,
    contract_rows,
    gradient_rows,
    gradients_of,
    kernels_of,
    notes,
    plot_check,
    summary,
    verdict,
)
from kdalab.views.tables import fmt_sci

__all__ = ["markdown_report", "html_report", "write_check_views"]


def _meta_lines(meta: dict) -> list[tuple[str, str]]:
    keys = [("command", "command"), ("date", "date (UTC)"), ("resumed", "resumed (UTC)"),
            ("device_name", "device"), ("suite", "suite"), ("versions", "versions"),
            ("thresholds", "thresholds"), ("elapsed_s", "elapsed")]
    out = []
    for key, label in keys:
        if key not in meta:
            continue
        value = meta[key]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):  # the dates a resumed run was continued on
            value = ", ".join(map(str, value))
        elif key == "elapsed_s":
            value = f"{value:.1f} s"
        out.append((label, str(value)))
    return out


def _summary_cells(row: dict) -> list[str]:
    out = []
    for key, value in row.items():
        if isinstance(value, float):
            value = (f"{100 * value:.2f}%" if key == "lowest identical"
                     else f"{value:.2f}" if key.startswith("median") and value >= 0.1
                     else fmt_sci(value))
        out.append(str(value))
    return out


def _verdict(df: pd.DataFrame, meta: dict) -> str:
    return verdict(df, complete=meta.get("complete", True))[1]


def _contract_cells(r: dict) -> list[str]:
    diff = fmt_sci(r["max diff"])
    if r["grad max diff"] == r["grad max diff"]:  # judged under --grad
        diff = f"{diff}; ∇ {fmt_sci(r['grad max diff'])}"
    return [r["case"], r["kernel"], f"{_STATUS_MARK[r['status']]} {r['status']}", r["compared"],
            diff, "" if r["x floor"] != r["x floor"] else
            f"{r['x floor']:.2f}", r["message"]]


_CONTRACT_HEAD = ["contract", "kernel", "status", "compared", "largest difference",
                  "× floor", "message"]
_GRAD_ABOUT = ("each gradient's relative error against the fp64 reference's, and its multiple "
               "of the floor; the floor row: the floor's own error (the float32 recurrence's "
               "gradients rounded to bf16 at the tokens; docs/training.md)")


def _grad_cells(r: dict, names: list[str]) -> list[str]:
    mark = f"{_STATUS_MARK[r['status']]} " if r["status"] else ""
    cells = [f"`{r['case']}`", f"{mark}{r['kernel']}"]
    for name in names:
        err, mult = r[name]
        cells.append("" if err != err else fmt_sci(err) if mult != mult
                     else f"{fmt_sci(err)} ({mult:.1f}×)" if mult < 1e3
                     else f"{fmt_sci(err)} ({fmt_sci(mult)}×)")
    return cells


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_report(records, meta: dict, image: str | None = "errors.png") -> str:
    """The report as Markdown (the plot linked as ``image``)."""
    df = _frame(records)
    fidelity = _mode(df) == "fidelity"
    kernels, cases = kernels_of(df), cases_of(df)
    lines = ["# kdalab check", ""]
    lines += [f"- **{label}:** {_md_escape(value)}" for label, value in _meta_lines(meta)]
    lines += ["", f"**{_verdict(df, meta)}**", ""]
    s = summary(df)
    lines += ["| " + " | ".join(s.columns) + " |", "|" + "---|" * len(s.columns)]
    lines += ["| " + " | ".join(_summary_cells(r)) + " |" for r in s.to_dict("records")]
    what = ("identical output bits / worst relative difference, against "
            f"`{df['against'].iloc[0]}`" if fidelity else
            "output / final-state relative error against the fp64 recurrence, and the larger "
            "of the two as a multiple of the case's floor")
    lines += ["", f"## Cases ({what}; ✓ pass, ✗ fail, – unsupported)", ""]
    head = ["case"] + ([] if fidelity else ["floor"]) + [f"`{k}`" for k in kernels]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        c = df[df["case"] == case].set_index("kernel")
        row = [f"`{case}`"] + ([] if fidelity else [fmt_sci(_case_floor(df, case, _FLOOR))])
        for kernel in kernels:
            if kernel not in c.index:
                row.append("")
                continue
            rec = c.loc[kernel].to_dict()
            text = f"{_STATUS_MARK[rec['status']]} {cell_text(rec)}"
            row.append(f"**{text}**" if rec["status"] == "fail" else text)
        lines.append("| " + " | ".join(row) + " |")
    contracts = contract_rows(df)
    if contracts:
        lines += ["", "## Contracts", "", "| " + " | ".join(_CONTRACT_HEAD) + " |",
                  "|" + "---|" * len(_CONTRACT_HEAD)]
        lines += ["| " + " | ".join(_md_escape(str(c)) for c in _contract_cells(r)) + " |"
                  for r in contracts]
    grads, names = gradient_rows(df), gradients_of(df)
    if grads:
        head = ["case", "kernel", *names]
        lines += ["", "## Gradients", "", f"{_GRAD_ABOUT[0].upper()}{_GRAD_ABOUT[1:]}.", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_grad_cells(r, names)) + " |" for r in grads]
    found = notes(df)
    if found:
        lines += ["", "## Failures and unsupported cases", ""]
        lines += [f"- {_md_escape(n)}" for n in found]
    if image:
        lines += ["", f"![errors per case and kernel]({image})"]
    lines += ["", "## What the cases are", "", "| case | family | shape | options | about |",
              "|---|---|---|---|---|"]
    for case in cases:
        r = df[df["case"] == case].iloc[0].to_dict()
        lines.append(f"| `{case}` | {r['family']} | {_shape(r)} | {_options(r)} | "
                     f"{_md_escape(str(r['about']))} |")
    return "\n".join(lines) + "\n"


def _shape(r: dict) -> str:
    seq = (f"seqlens [{r['seqlens']}]" if r["seqlens"] else f"B={r['batch']}, T={r['T']}")
    return f"{seq}, H={r['heads']}, K={r['K']}, V={r['V']}"


def _options(r: dict) -> str:
    lb = r["lower_bound"]
    gate = r.get("gate") or "lower_bound"
    bits = [f"lb {lb:g}" if lb is not None else "no bound",  # the unbounded gate, a log-decay
            f"h0 {r['initial_state']}"]
    if gate != "lower_bound":
        bits.insert(0, f"gate {gate}")
    if r["state_scale"] != 1:
        bits.append(f"h0 × {r['state_scale']:g}")
    if r["v_scale"] != 1:
        bits.append(f"v × {r['v_scale']:g}")
    if r["prenormalized"]:
        bits.append("pre-normalized q/k")
    if r["poison"]:
        bits.append(f"poison {r['poison']}")
    if r.get("key_noise"):
        bits.append(f"key noise {r['key_noise']:g}")
    if r.get("kind", "accuracy") != "accuracy":
        bits.append(f"contract {r['kind']}" + (f" at P = {r['split']}" if r.get("split") else ""))
    return ", ".join(bits)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; }
th { background: #f3f3f3; }
td.num { text-align: right; font-family: ui-monospace, monospace; white-space: nowrap; }
td.pass { background: #eef8ee; } td.fail { background: #fbdada; font-weight: bold; }
td.unsupported, td.skipped, td.excluded { background: #f6f6f6; color: #888; }
.verdict-pass { color: #176b17; } .verdict-fail { color: #b00; }
img { max-width: 100%; }
code { font-size: 0.95em; }
"""


def html_report(records, meta: dict, png: bytes | None = None) -> str:
    """One self-contained HTML page: meta, verdict, summary, the kernel × case table (failures
    red; the full message of each cell as its tooltip), the plot embedded, the notes and what
    the cases are."""
    df = _frame(records)
    fidelity = _mode(df) == "fidelity"
    kernels, cases = kernels_of(df), cases_of(df)
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kdalab check</title>"
             f"<style>{_CSS}</style></head><body><h1>kdalab check</h1><ul>"]
    parts += [f"<li><b>{e(label)}:</b> {e(value)}</li>" for label, value in _meta_lines(meta)]
    line = _verdict(df, meta)
    cls = "verdict-fail" if line.startswith("FAIL") else "verdict-pass"
    parts.append(f"</ul><h2 class='{cls}'>{e(line)}</h2>")
    s = summary(df)
    parts.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in s.columns) + "</tr>")
    for r in s.to_dict("records"):
        parts.append("<tr>" + "".join(f"<td class='num'>{e(v)}</td>" for v in _summary_cells(r))
                     + "</tr>")
    parts.append("</table>")
    what = ("identical output bits / worst relative difference against "
            f"<code>{e(str(df['against'].iloc[0]))}</code>" if fidelity else
            "output / final-state relative error against the fp64 token recurrence, and the "
            "larger of the two as a multiple of the case's floor")
    parts.append(f"<h2>Cases</h2><p>{what}. ✓ pass, ✗ fail, – unsupported (hover a cell for "
                 f"its message).</p><table><tr><th>case</th>")
    if not fidelity:
        parts.append("<th>floor</th>")
    parts += [f"<th><code>{e(k)}</code></th>" for k in kernels]
    parts.append("</tr>")
    for case in cases:
        c = df[df["case"] == case].set_index("kernel")
        about = str(df[df["case"] == case]["about"].iloc[0])
        parts.append(f"<tr><td title='{e(about)}'><code>{e(case)}</code></td>")
        if not fidelity:
            parts.append(f"<td class='num'>{e(fmt_sci(_case_floor(df, case, _FLOOR)))}</td>")
        for kernel in kernels:
            if kernel not in c.index:
                parts.append("<td></td>")
                continue
            rec = c.loc[kernel].to_dict()
            text = f"{_STATUS_MARK[rec['status']]} {cell_text(rec)}"
            tip = rec["message"] or rec["status"]
            parts.append(f"<td class='num {rec['status']}' title='{e(str(tip))}'>{e(text)}</td>")
        parts.append("</tr>")
    parts.append("</table>")
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>Errors per case and kernel</h2><img alt='errors per case and "
                     f"kernel' src='data:image/png;base64,{data}'>")
    contracts = contract_rows(df)
    if contracts:
        parts.append("<h2>Contracts</h2><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in _CONTRACT_HEAD) + "</tr>")
        for r in contracts:
            parts.append(f"<tr class='{r['status']}'>" + "".join(
                f"<td>{e(str(c))}</td>" for c in _contract_cells(r)) + "</tr>")
        parts.append("</table>")
    grads, names = gradient_rows(df), gradients_of(df)
    if grads:
        parts.append(f"<h2>Gradients</h2><p>{e(_GRAD_ABOUT)}.</p><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in ["case", "kernel", *names])
                     + "</tr>")
        for r in grads:
            cells = [c.strip("`") for c in _grad_cells(r, names)]
            parts.append(f"<tr class='{r['status']}'>" + "".join(
                f"<td class='num'>{e(c)}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    found = notes(df)
    if found:
        parts.append("<h2>Failures and unsupported cases</h2><ul>")
        parts += [f"<li>{e(n)}</li>" for n in found]
        parts.append("</ul>")
    parts.append("<h2>What the cases are</h2><table><tr><th>case</th><th>family</th>"
                 "<th>shape</th><th>options</th><th>about</th></tr>")
    for case in cases:
        r = df[df["case"] == case].iloc[0].to_dict()
        parts.append(f"<tr><td><code>{e(case)}</code></td><td>{e(r['family'])}</td>"
                     f"<td>{e(_shape(r))}</td><td>{e(_options(r))}</td>"
                     f"<td>{e(str(r['about']))}</td></tr>")
    parts.append("</table></body></html>\n")
    return "".join(parts)


def write_check_views(records, meta: dict, out: str | Path) -> list[Path]:
    """``report.md``, ``report.html`` (self-contained) and ``errors.png`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_check(records)
    paths = [out / "errors.png", out / "report.md", out / "report.html"]
    paths[0].write_bytes(png)
    paths[1].write_text(markdown_report(records, meta), encoding="utf-8")
    paths[2].write_text(html_report(records, meta, png), encoding="utf-8")
    return paths

"""Tables drawn from records: the seed document's three tables, and any frame as Markdown.

Every table comes from stored records through :func:`kdalab.studies.aggregate.summarize`;
nothing is typed by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["SeedTable", "seed_tables", "fmt_sci", "fmt_percent", "to_markdown",
           "write_seed_tables", "markdown_table"]


def fmt_sci(x: float) -> str:
    """3 significant digits, the seed's style: 8.80e-07 → '8.80e-7'; inf → '∞'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    mant, _, exp = f"{x:.2e}".partition("e")
    e = int(exp)
    return mant if e == 0 else f"{mant}e{e}"


def fmt_percent(x: float) -> str:
    return f"{100 * x:.0f}%"


@dataclass
class SeedTable:
    name: str  # file stem
    title: str
    family: str
    accumulation: str
    frame: pd.DataFrame  # raw numbers, columns in the seed's order
    formatters: dict


_LAYOUTS = {
    "floor": ("exponent_boundary", "Exponent boundary (floor, every step at the lower bound)", [
        ("Chunk C", "chunk", str),
        ("inverse finite", "inv_finite_fraction", fmt_percent),
        ("decay = 0", "decay_zeros_max", str),
        ("reciprocal = inf", "inv_decay_nonfinite_max", str),
        ("INV total", "inv_total_rel_rmse_median", fmt_sci),
        ("INV power", "inv_stable_l_rel_rmse_median", fmt_sci),
    ]),
    "weak_decay_correlated": ("high_power_stress", "High-power stress (weak_decay_correlated)", [
        ("Chunk C", "chunk", str),
        ("Highest power formed", "stable_l_highest_power", lambda p: f"L^{p}"),
        ("Max power magnitude", "stable_l_power_max_max", fmt_sci),
        ("INV total", "inv_total_rel_rmse_median", fmt_sci),
        ("INV power", "inv_stable_l_rel_rmse_median", fmt_sci),
        ("Finite", "inv_finite_fraction", fmt_percent),
    ]),
    "model_like": ("ordinary_random", "Ordinary random input (model_like)", [
        ("Chunk C", "chunk", str),
        ("Finite", "inv_finite_fraction", fmt_percent),
        ("INV total", "inv_total_rel_rmse_median", fmt_sci),
        ("INV power", "inv_stable_l_rel_rmse_median", fmt_sci),
        ("Max power magnitude", "stable_l_power_max_max", fmt_sci),
    ]),
}


def seed_tables(summary: pd.DataFrame, dim: int | None = None) -> list[SeedTable]:
    """The seed's three tables (one per family, per accumulation model and lower bound), drawn
    from the records' aggregates (:func:`kdalab.studies.aggregate.summarize`)."""
    tables = []
    if summary.empty:
        return tables
    if dim is not None:
        summary = summary[summary["dim"] == dim]
    for family, (stem, title, cols) in _LAYOUTS.items():
        fam = summary[summary["family"] == family]
        groups = list(fam.groupby(["accumulation", "lower_bound", "dim"], dropna=False,
                                  sort=True))
        for (acc, lb, d), g in groups:
            g = g.sort_values("chunk")
            frame = pd.DataFrame({label: g[col].to_list() for label, col, _ in cols})
            suffix = f", lower bound {lb:g}" if not math.isnan(lb) and lb != -5.0 else ""
            # one table per family keeps the plain name; several get their parameters in it
            name = stem if len(groups) == 1 else \
                f"{stem}_{acc}_d{d}" + ("" if math.isnan(lb) else f"_lb{lb:g}")
            tables.append(SeedTable(
                name=name, title=f"{title}{suffix} — accumulation {acc}, dim {d}",
                family=family, accumulation=acc, frame=frame,
                formatters={label: f for label, _, f in cols}))
    return tables


def to_markdown(table: SeedTable) -> str:
    cols = list(table.frame.columns)
    lines = [f"### {table.title}", "", "| " + " | ".join(cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]
    for row in table.frame.to_dict("records"):  # keeps each column's own type
        lines.append("| " + " | ".join(table.formatters[c](row[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_seed_tables(tables: list[SeedTable], folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in tables:
        md = folder / f"{t.name}.md"
        md.write_text(to_markdown(t), encoding="utf-8")
        csv = folder / f"{t.name}.csv"
        t.frame.to_csv(csv, index=False)
        paths += [md, csv]
    return paths


def markdown_table(frame: pd.DataFrame, fmt_float=lambda v: f"{v:.3g}") -> str:
    """``frame`` as a Markdown table; floats through ``fmt_float``."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(fmt_float(v) if isinstance(v, float) else str(v)
                                       for v in row) + " |")
    return "\n".join(lines) + "\n"

"""Tables drawn from records: the seed document's three tables, and any frame as Markdown.

Every table comes from stored records through :func:`kdalab.studies.aggregate.summarize`;
nothing is typed by hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["SeedTable", "seed_tables", "fmt_sci", "fmt_percent", "to_markdown",
           "write_seed_tables", "markdown_table", "printed_rows", "published_seed_tables",
           "compare_with_published"]


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


def printed_rows(table: SeedTable) -> list[list[str]]:
    """The table's cells as they are printed (and as the seed document prints them)."""
    cols = list(table.frame.columns)
    return [[table.formatters[c](row[c]) for c in cols] for row in table.frame.to_dict("records")]


def published_seed_tables() -> dict[str, dict]:
    """The seed document's three tables as it prints them, by table name (``columns``, ``rows``
    of text): kdalab's package data ``data/seed_tables.json``, transcribed from the document."""
    from importlib import resources

    text = resources.files("kdalab").joinpath("data", "seed_tables.json").read_text("utf-8")
    return json.loads(text)["tables"]


def compare_with_published(tables: list[SeedTable]) -> tuple[int, list[str]]:
    """The published values these tables reproduce, compared at the printed precision (as
    text): ``(how many, what differs)``, one phrase per published value that differs or was
    not computed (``exponent_boundary, C = 19, INV total: published ∞, computed 1.2e-5``)."""
    mine = {}
    for t in tables:
        stem = _LAYOUTS[t.family][0]
        if stem in mine:
            raise ValueError(f"several {stem} tables (accumulation models, lower bounds or "
                             "dims): the published values are compared with one of each")
        mine[stem] = (list(t.frame.columns), {r[0]: r for r in printed_rows(t)})
    same, differ = 0, []
    for stem, published in published_seed_tables().items():
        columns, rows = mine.get(stem, (published["columns"], {}))
        for row in published["rows"]:
            got = rows.get(row[0])
            for column, value in zip(published["columns"][1:], row[1:]):
                computed = "not computed" if got is None else \
                    f"computed {got[columns.index(column)]}"
                if computed == f"computed {value}":
                    same += 1
                else:
                    differ.append(f"{stem}, C = {row[0]}, {column}: published {value}, "
                                  f"{computed}")
    return same, differ


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

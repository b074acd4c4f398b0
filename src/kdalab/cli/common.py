"""Shared pieces of the commands: a config object built from options (errors naming the options),
the inverse experiment with a cost-weighted progress bar and records streamed to disk, tables on
the terminal, the inverse experiment's views on disk."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from kdalab.cli.app import console
from kdalab.cli.progress import WeightedProgress, drawing, record_file

__all__ = ["labelled", "run_with_progress", "print_table", "write_inverse_views"]


def labelled(cls, raw: dict, names: dict):
    """``cls(**raw)`` (a config that parses its fields once), its errors naming the options as
    typed (``names``: field -> option)."""
    from kdalab import params
    from kdalab.errors import Unavailable

    try:
        return cls(**raw)
    except (ValueError, Unavailable) as exc:
        raise params.renamed(exc, names) from None


def run_with_progress(runs: Sequence, accumulations: Sequence, *, recipe, device: str,
                      out: Path, quiet: bool = False, resume_hint: str = "") -> list[dict]:
    """Run the inverse experiment batched, streaming records to ``out`` as they are produced."""
    from kdalab.experiments.sweep import record_cost, run_sweep

    names = [getattr(m, "name", m) for m in accumulations]
    total = sum(record_cost(r.chunk, r.dim, n) for r in runs for n in names)
    t0 = time.perf_counter()
    with record_file(out, resume_hint) as writer, \
            WeightedProgress("runs", len(runs), total, quiet) as bar:
        def sink(records: list[dict]) -> None:
            writer.write(records)
            bar.advance(len(records) // len(names),
                        sum(record_cost(r["chunk"], r["dim"], r["accumulation"])
                            for r in records))

        records = run_sweep(runs, accumulations, recipe=recipe, device=device, sink=sink)
    if not quiet:
        console.print(f"{len(runs)} runs × {len(names)} accumulation model(s) → "
                      f"{len(records)} records in {time.perf_counter() - t0:.1f} s",
                      highlight=False)
    return records


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table on the terminal, its title on a line of its own (a rich title wraps at the
    table's width: "dim ⏎ 128"). No cell is cut or folded: names left, numbers right, each column
    as wide as its widest entry; a table wider than the terminal is printed whole."""
    from rich import box
    from rich.table import Table

    console.print(f"[bold]{title}[/]", highlight=False, soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False)
    for i, col in enumerate(columns):
        cells = [str(row[i]) for row in rows]
        numeric = all(_is_number(c) for c in cells)
        table.add_column(col, justify="right" if numeric else "left", no_wrap=True,
                         min_width=max([len(c) for c in cells] + [len(col)]))
    for row in rows:
        table.add_row(*row)
    width = max(console.width, console.measure(table).maximum)
    console.print(table, width=width, crop=False)
    console.print()


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("%").replace("∞", "inf").replace("L^", ""))
        return True
    except ValueError:
        return False


def write_inverse_views(records: list[dict], out: Path, *, show: bool = True) -> list[Path]:
    """The seed's tables (printed unless ``show`` is False, and as Markdown and CSV), the summary
    and the error plot, into ``out``."""
    from kdalab.views.tables import seed_tables

    tables = seed_tables(records)
    if show:
        for t in tables:
            print_table(t.title, list(t.frame.columns),
                        [[t.formatters[c](row[c]) for c in t.frame.columns]
                         for row in t.frame.to_dict("records")])
    with drawing(quiet=not show):
        from kdalab.experiments.aggregate import summarize
        from kdalab.views.plots import plot_error_vs_chunk
        from kdalab.views.tables import write_seed_tables

        paths = write_seed_tables(tables, out)
        summary = out / "summary.csv"  # every aggregate of every group, one row per config
        summarize(records).to_csv(summary, index=False)
        paths.append(summary)
        paths += plot_error_vs_chunk(records, out)
    return paths

"""Shared pieces of the commands: option parsing that fails cleanly, progress, views on disk."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdalab.cli.app import console, fail

__all__ = ["parse_or_fail", "check_device", "run_with_progress", "print_seed_tables",
           "write_inverse_views"]


def parse_or_fail(fn: Callable, *args):
    try:
        return fn(*args)
    except ValueError as exc:
        fail(str(exc))


def check_device(device: str) -> str:
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        fail(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is available on this machine (torch.cuda."
             "is_available() is False); use --device cpu")
    return device


def run_with_progress(runs: Sequence, accumulations: Sequence[str], *, recipe: str,
                      device: str, out: Path, quiet: bool = False) -> list[dict]:
    """Run the inverse experiment batched, streaming records to ``out`` as they are produced."""
    from kdalab.experiments.store import RecordWriter
    from kdalab.experiments.sweep import run_sweep

    t0 = time.perf_counter()
    with RecordWriter(out) as writer, Progress(
        TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet,
    ) as progress:
        task = progress.add_task("runs", total=len(runs))
        records = run_sweep(runs, accumulations, recipe=recipe, device=device,
                            sink=writer.write,
                            progress=lambda done, total: progress.update(task, completed=done))
    if not quiet:
        console.print(f"{len(runs)} runs × {len(accumulations)} accumulation model(s) → "
                      f"{len(records)} records in {time.perf_counter() - t0:.1f} s")
    return records


def print_seed_tables(tables) -> None:
    for t in tables:
        table = Table(title=t.title, title_justify="left")
        for col in t.frame.columns:
            table.add_column(col, justify="right")
        for row in t.frame.to_dict("records"):
            table.add_row(*(t.formatters[c](row[c]) for c in t.frame.columns))
        console.print(table)


def write_inverse_views(records: list[dict], out: Path, *, show: bool = True) -> list[Path]:
    from kdalab.experiments.aggregate import summarize
    from kdalab.views.plots import plot_error_vs_chunk
    from kdalab.views.tables import seed_tables, write_seed_tables

    tables = seed_tables(records)
    if show:
        print_seed_tables(tables)
    paths = write_seed_tables(tables, out)
    summary = out / "summary.csv"  # every aggregate of every group, one row per configuration
    summarize(records).to_csv(summary, index=False)
    paths.append(summary)
    paths += plot_error_vs_chunk(records, out)
    return paths

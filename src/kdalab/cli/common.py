"""Shared pieces of the commands: option parsing that fails cleanly, progress, views on disk."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kdalab.cli.app import console, err_console, fail

__all__ = ["parse_or_fail", "check_device", "run_into_folder", "draw_views", "export_json",
           "print_seed_tables"]


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


def run_into_folder(plan, out: Path, *, resume: bool = False, force: bool = False,
                    backend: str = "local", address: str | None = None,
                    quiet: bool = False, json_export: bool = False) -> None:
    """Run ``plan`` into the store in ``out`` (see :mod:`kdalab.experiments.runstore`) with a
    progress bar, then draw the views once from the stored records. Ctrl-C keeps every record
    finished and says how to continue (exit 130)."""
    from kdalab.experiments.runstore import StoreError
    from kdalab.experiments.sweep import open_store, run_into_store

    t0 = time.perf_counter()
    try:
        store = open_store(plan, out, resume=resume, force=force)
    except StoreError as exc:
        fail(str(exc))
    with store:
        before = int(store.done.sum())
        if before and not quiet:
            console.print(f"resuming: {before} of {store.runs} runs already stored in {out}/")
        try:
            with Progress(
                TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=console, transient=True, disable=quiet,
            ) as progress:
                task = progress.add_task("runs", total=store.runs, completed=before)
                ran = run_into_store(
                    plan, store, backend=backend, address=address,
                    progress=lambda done, total: progress.update(task, completed=done))
        except KeyboardInterrupt:
            store.close()
            err_console.print(
                f"interrupted: {int(store.done.sum())} of {store.runs} runs are stored in "
                f"{out}/; continue with: kdalab sweep --out {out} --resume", highlight=False)
            raise typer.Exit(130) from None
        elapsed = time.perf_counter() - t0
        if not quiet:
            console.print(f"{ran} runs × {len(plan.accumulations)} accumulation model(s) in "
                          f"{elapsed:.1f} s ({store.runs} runs stored in {out}/)")
        paths = draw_views(store, show=not quiet)
        if json_export:
            paths.append(export_json(store, out / "records.json"))
    if not quiet:
        console.print(f"wrote {len(paths)} view file(s) to {out}/")


def draw_views(store, *, show: bool = True) -> list[Path]:
    """The inverse experiment's views, drawn once from the stored records (their aggregates,
    read one group at a time): the seed tables (Markdown, CSV), every aggregate
    (``summary.csv``) and the error plot. The files of the previous drawing are removed first,
    so no stale table survives, and the new ones listed in the store's manifest."""
    from kdalab.experiments.aggregate import summarize_store
    from kdalab.views.plots import plot_error_vs_chunk
    from kdalab.views.tables import seed_tables, write_seed_tables

    if store.writable:
        store.flush()  # the records on disk before anything is drawn from them
    with console.status("drawing views", spinner="dots") if show else _nothing():
        summary = summarize_store(store)
        store.remove_views()
        tables = seed_tables(summary)
        paths = write_seed_tables(tables, store.folder)
        summary_csv = store.folder / "summary.csv"  # every aggregate, one row per configuration
        summary.to_csv(summary_csv, index=False)
        paths.append(summary_csv)
        if not summary.empty:
            paths += plot_error_vs_chunk(summary, store.folder)
        store.set_views(paths)
    if show:
        print_seed_tables(tables)
    return paths


def export_json(store, path: Path) -> Path:
    """All records as one JSON list, in run order, streamed group by group (non-finite floats
    as the strings "inf", "-inf", "nan")."""
    import json

    from kdalab.experiments.store import encode_record

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("[")
        first = True
        for _, table in store.iter_groups():
            for rec in table.to_pylist():
                fh.write(("\n" if first else ",\n")
                         + json.dumps(encode_record(rec), allow_nan=False))
                first = False
        fh.write("\n]\n")
    tmp.replace(path)
    return path


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def print_seed_tables(tables) -> None:
    for t in tables:
        table = Table(title=t.title, title_justify="left")
        for col in t.frame.columns:
            table.add_column(col, justify="right")
        for row in t.frame.to_dict("records"):
            table.add_row(*(t.formatters[c](row[c]) for c in t.frame.columns))
        console.print(table)

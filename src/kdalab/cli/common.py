"""Shared pieces of the commands: a config object built from options (errors naming the options),
the inverse experiment run into its store with a cost-weighted progress bar, tables on the
terminal, the inverse experiment's views drawn from the store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from kdalab.cli.app import STATE, console, mark
from kdalab.cli.progress import WeightedProgress, drawing

__all__ = ["labelled", "run_into_folder", "draw_views", "export_json", "print_table",
           "start_helpers"]


def labelled(cls, raw: dict, names: dict):
    """``cls(**raw)`` (a config that parses its fields once), its errors naming the options as
    typed (``names``: field -> option)."""
    from kdalab import params
    from kdalab.errors import Unavailable

    try:
        return cls(**raw)
    except (ValueError, Unavailable) as exc:
        raise params.renamed(exc, names) from None


def run_into_folder(plan, out: Path, *, resume: bool = False, force: bool = False,
                    backend: str = "local", address: str | None = None,
                    quiet: bool = False, json_export: bool = False,
                    again: str = "kdalab sweep --out {out} --resume") -> list[Path]:
    """Run ``plan`` into the store in ``out`` (:mod:`kdalab.records`) with a
    cost-weighted progress bar, then draw the views once from the stored records; return the
    files written. Interrupted, every finished part is kept and the boundary says how to
    continue (``again``, with ``{out}``)."""
    from kdalab.runner import open_store, run_into_store
    from kdalab.studies.sweep import record_cost

    names = [m.name for m in plan.accumulations]

    def weight(batch) -> float:
        run = batch.runs[0]
        return len(batch.runs) * sum(record_cost(run.chunk, run.dim, n) for n in names)

    runs_per_cell = [len(pairs) * len(plan.seeds) for _, _, pairs in plan.cells]
    total = sum(k * sum(record_cost(c, d, n) for n in names)
                for k, (c, d, _) in zip(runs_per_cell, plan.cells))
    t0 = time.perf_counter()
    first = [True]

    def advance(batch) -> None:
        if first.pop() if first else False:
            mark("first batch stored")
        bar.advance(len(batch.runs), weight(batch))

    with open_store(plan, out, resume=resume, force=force) as store:
        mark("store open")
        before = int(store.done.sum())
        if before and not quiet:
            console.print(f"resuming: {before} of {store.runs} runs already stored in {out}/",
                          highlight=False)
        try:
            with WeightedProgress("runs", store.runs, total, quiet) as bar:
                bar.advance(before, total * before / max(store.runs, 1))
                ran = run_into_store(plan, store, backend=backend, address=address,
                                     progress=advance)
            store.flush()
            mark("swept: every record on disk")
        except BaseException:
            store.close()  # what was computed is on disk before anything is said
            STATE.kept.append(f"{int(store.done.sum())} of {store.runs} runs stored in {out}")
            STATE.resume = f"'{again.format(out=out)}' continues with the rest"
            raise
        if not quiet:
            console.print(f"{ran} runs × {len(names)} accumulation model(s) in "
                          f"{time.perf_counter() - t0:.1f} s; {store.runs} runs stored in "
                          f"{out}/", highlight=False)
        paths = draw_views(store, show=not quiet)
        mark("views drawn")
        if json_export:
            paths.append(export_json(store, out / "records.json"))
    return paths


def draw_views(store, *, show: bool = True) -> list[Path]:
    """The inverse experiment's views, drawn once from the stored records' aggregates
    (:func:`~kdalab.views.sweep_views.draw_sweep_views`, by the views worker if the command
    started one): the seed's tables (printed unless ``show`` is False, and as Markdown and
    CSV), every aggregate (``summary.csv``) and the error plot. The previous drawing's files are
    removed first, so no stale table survives; the new ones are listed in the manifest."""
    if store.writable:
        store.flush()  # the records on disk before anything is drawn from them
    with drawing(quiet=not show):
        store.remove_views()
        mark("views asked for")
        paths, text = _drawn(store)
        store.set_views(paths)
    if show:
        for title, columns, rows in text:
            print_table(title, columns, rows)
    return paths


def start_helpers(*, draw_servers: bool = False) -> None:
    """Start the helper processes a sweep will use (:mod:`kdalab.experiments.helper`), before
    this process imports torch: the views worker (unless matplotlib is loaded here already, as
    in a test session) and, for a CUDA sweep, the draw servers. ``KDALAB_NO_HELPERS=1``
    starts none (everything then runs in this process: the same files and records)."""
    import os
    import sys

    from kdalab.experiments import helper

    if os.environ.get("KDALAB_NO_HELPERS", "") not in ("", "0"):
        return
    if "matplotlib" not in sys.modules:
        helper.start_early(helper.VIEWS_WORKER)
    if draw_servers:
        helper.start_early(helper.DRAW_SERVER, helper.draw_servers())
    mark("helpers started")


def _drawn(store):
    """The views drawn by the views worker started early, or here if there is none or it
    fails."""
    from kdalab.experiments.helper import VIEWS_WORKER, HelperError, take_early

    for worker in take_early(VIEWS_WORKER):
        try:
            paths, text = worker.request(str(store.folder))
            return [Path(p) for p in paths], text
        except HelperError:
            pass  # drawn here instead, the same files
        finally:
            worker.close()
    from kdalab.views.sweep_views import draw_sweep_views

    return draw_sweep_views(store)


def export_json(store, path: Path) -> Path:
    """Every record as one JSON list in run order, streamed group by group (non-finite floats as
    the strings "inf", "-inf", "nan"); written whole or not at all."""
    import json

    from kdalab.records.legacy import encode_record

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("[")
        sep = "\n"
        for _, table in store.iter_groups():
            for rec in table.to_pylist():
                fh.write(sep + json.dumps(encode_record(rec), allow_nan=False))
                sep = ",\n"
        fh.write("\n]\n")
    tmp.replace(path)
    return path


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

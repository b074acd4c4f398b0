"""A study run into its store from the command line: a cost-weighted progress bar while the
batches run, what was kept said on an interrupt, then the views drawn once from the stored
records (the tables printed)."""

from __future__ import annotations

import time
from pathlib import Path

from kdalab.cli.app import STATE, console
from kdalab.cli.progress import WeightedProgress, drawing

__all__ = ["run_into_folder", "draw_views", "export_json"]


def run_into_folder(plan, out: Path, *, resume: bool = False, force: bool = False,
                    backend: str = "local", address: str | None = None,
                    quiet: bool = False, json_export: bool = False,
                    again: str = "kdalab sweep --out {out} --resume") -> list[Path]:
    """Run ``plan`` into the store in ``out`` with a cost-weighted progress bar, then draw the
    views once from the stored records; return the files written. Interrupted, every finished
    part is kept and the boundary says how to continue (``again``, with ``{out}``)."""
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
    with open_store(plan, out, resume=resume, force=force) as store:
        before = int(store.done.sum())
        if before and not quiet:
            console.print(f"resuming: {before} of {store.runs} runs already stored in {out}/",
                          highlight=False)
        try:
            with WeightedProgress("runs", store.runs, total, quiet) as bar:
                bar.advance(before, total * before / max(store.runs, 1))
                ran = run_into_store(plan, store, backend=backend, address=address,
                                     progress=lambda b: bar.advance(len(b.runs), weight(b)))
            store.flush()
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
        if json_export:
            paths.append(export_json(store, out / "records.json"))
    return paths


def draw_views(store, *, show: bool = True) -> list[Path]:
    """The inverse experiment's views, drawn once from the stored records' aggregates
    (:func:`~kdalab.views.sweep_views.draw_sweep_views`): the seed's tables (printed unless
    ``show`` is False, and as Markdown and CSV), every aggregate (``summary.csv``) and the error
    plot. The previous drawing's files are removed first, so no stale table survives; the new
    ones are listed in the manifest."""
    from kdalab.cli.common import print_table
    from kdalab.views.sweep_views import draw_sweep_views

    if store.writable:
        store.flush()  # the records on disk before anything is drawn from them
    with drawing(quiet=not show):
        store.remove_views()
        paths, text = draw_sweep_views(store)
        store.set_views(paths)
    if show:
        for title, columns, rows in text:
            print_table(title, columns, rows)
    return paths


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

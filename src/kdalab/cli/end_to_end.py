"""``kdalab run end-to-end``: the layer's output and final-state error against the fp64
recurrent reference, over families, lower bounds, chunk sizes, recipes and tile strategies."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kdalab.cli.app import console, fail, run_app
from kdalab.cli.common import check_device, parse_or_fail


@run_app.command("end-to-end")
def end_to_end(
    quick: Annotated[bool, typer.Option(
        help="a small study (seconds): dim 32, T 64/256, 4 gates, chunks 8,16,64, 4 variants")]
    = False,
    families: Annotated[Optional[str], typer.Option(
        help="model_like,saturated,weak_decay_correlated,long")] = None,
    lower_bounds: Annotated[Optional[str], typer.Option(
        help="lower bounds < 0 and/or 'unbounded', e.g. '-1,-5,unbounded'")] = None,
    chunks: Annotated[Optional[str], typer.Option(help="chunk sizes, e.g. '8,16,32,64'")] = None,
    variants: Annotated[Optional[str], typer.Option(
        help="recipe/tiles/inverse list, e.g. 'flashkda/chunk_start/neumann,fp32/per_pair/exact'")]
    = None,
    seeds: Annotated[Optional[str], typer.Option(help="seeds, e.g. '0-1'")] = None,
    length: Annotated[Optional[int], typer.Option(help="T of the short families")] = None,
    long_length: Annotated[Optional[int], typer.Option(help="T of the long family")] = None,
    heads: Annotated[Optional[int], typer.Option(help="heads (H = HV)")] = None,
    dim: Annotated[Optional[int], typer.Option(help="head dimension K = V")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/end-to-end"),
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
    redraw: Annotated[bool, typer.Option(
        help="run nothing: redraw the tables and plots from the records already in --out")]
    = False,
) -> None:
    """Output and final-state relative error of the chunked forward against the fp64 recurrent
    reference. Writes records (records.jsonl/json/parquet), tables (CSV, Markdown) and plots
    (PNG, SVG) to --out; records are appended as each cell finishes."""
    from kdalab import params
    from kdalab.experiments.end_to_end import FULL, QUICK, Variant, run_study
    from kdalab.experiments.store import RecordWriter
    from kdalab.views.end_to_end import write_e2e_views

    if redraw:
        from kdalab.experiments.store import read_records

        try:
            records = read_records(out)
        except FileNotFoundError as exc:
            fail(f"--redraw: {exc}")
        paths, _ = write_e2e_views(records, out)
        if not quiet:
            console.print(f"{len(records)} records → wrote {len(paths)} files to {out}/")
        return
    device = check_device(device)
    base = QUICK if quick else FULL
    changes: dict = {}
    if families is not None:
        changes["families"] = parse_or_fail(params.name_list, families, "--families")
    if lower_bounds is not None:
        changes["lower_bounds"] = parse_or_fail(lambda: params.lower_bounds(
            lower_bounds, "--lower-bounds", unbounded=True))
    if chunks is not None:
        changes["chunks"] = parse_or_fail(params.int_list, chunks, "--chunks", 1)
    if seeds is not None:
        changes["seeds"] = parse_or_fail(params.int_list, seeds, "--seeds", 0)
    if variants is not None:
        names = parse_or_fail(params.name_list, variants, "--variants")
        changes["variants"] = tuple(parse_or_fail(Variant.parse, v) for v in names)
    for name, value in (("length", length), ("long_length", long_length), ("heads", heads),
                        ("dim", dim)):
        if value is not None:
            if value < 1:
                fail(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            changes[name] = value
    cfg = parse_or_fail(lambda: replace(base, **changes))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.as_dict(), indent=1) + "\n")

    t0 = time.perf_counter()
    with RecordWriter(out) as writer, Progress(
        TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet,
    ) as progress:
        task = progress.add_task("cells", total=cfg.cells())
        records = run_study(cfg, sink=writer.write, device=device,
                            progress=lambda done, total: progress.update(task, completed=done))
    elapsed = time.perf_counter() - t0
    paths, table = write_e2e_views(records, out)
    if not quiet:
        console.print(f"{cfg.cells()} cells → {len(records)} records in {elapsed:.1f} s; "
                      f"wrote {len(paths) + 4} files to {out}/")

"""``kdalab run end-to-end``: the layer's output and final-state error against the fp64
recurrent reference, over families, lower bounds, chunk sizes, recipes and tile strategies."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import console, prose, run_app
from kdalab.cli.options import E2E_FAMILIES


@run_app.command(
    "end-to-end",
    short_help="The layer's output and state error against fp64, per recipe and chunk.",
    help=prose("""Output and final-state relative error of the chunked
forward against the fp64 recurrent reference. Writes records (records.jsonl, .json, .parquet),
tables (CSV, Markdown) and plots (PNG, SVG) to --out; records are appended as each cell
finishes, so an interrupted study keeps them (--redraw draws the views from them)."""))
def end_to_end(
    quick: Annotated[bool, typer.Option(
        help="A small study (seconds): dim 32, T 64/256, 4 gates, chunks 8,16,64, 4 variants")]
    = False,
    families: Annotated[Optional[str], typer.Option(
        help=f"Input families: {', '.join(E2E_FAMILIES)}", show_default="all")] = None,
    lower_bounds: Annotated[Optional[str], typer.Option(
        help="Lower bounds < 0 and/or 'unbounded', e.g. '-1,-5,unbounded'",
        show_default="-1,-2,-5,-8,-10,unbounded")] = None,
    chunks: Annotated[Optional[str], typer.Option(
        help="Chunk sizes, e.g. '8,16,32,64'", show_default="8,16,32,64")] = None,
    variants: Annotated[Optional[str], typer.Option(
        help="recipe/tiles/inverse, comma-separated, e.g. "
             "'flashkda/chunk_start/neumann,fp32/per_pair/exact'",
        show_default="11 variants (docs/end-to-end.md)")] = None,
    seeds: Annotated[Optional[str], typer.Option(
        help="Seeds, e.g. '0-1'", show_default="0-1")] = None,
    length: Annotated[Optional[int], typer.Option(
        help="T of the short families", show_default="1024")] = None,
    long_length: Annotated[Optional[int], typer.Option(
        help="T of the long family", show_default="4096")] = None,
    heads: Annotated[Optional[int], typer.Option(
        help="Heads (H = HV)", show_default="2")] = None,
    dim: Annotated[Optional[int], typer.Option(
        help="Head dimension K = V", show_default="128")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N")] = "cpu",
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/end-to-end"),
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="No progress or tables on the terminal")] = False,
    redraw: Annotated[bool, typer.Option(
        help="Run nothing: redraw the tables and plots from the records already in --out")]
    = False,
) -> None:
    from dataclasses import replace

    from kdalab import params
    from kdalab.cli.common import labelled
    from kdalab.cli.progress import WeightedProgress, drawing, record_file

    if redraw:
        from kdalab.records.legacy import read_records

        folder = Path(out)
        try:
            records = read_records(folder)
        except FileNotFoundError:
            raise ValueError(f"--out: no records in {str(folder)!r} to redraw") from None
        with drawing(quiet=quiet):
            from kdalab.views.end_to_end import write_e2e_views

            paths, _ = write_e2e_views(records, folder)
        if not quiet:
            console.print(f"{len(records)} records → wrote {len(paths)} files to {folder}/",
                          highlight=False)
        return
    from kdalab.studies.end_to_end import FULL, QUICK, cell_cost, run_study

    device = params.device(device, "--device")
    base = QUICK if quick else FULL
    given = {"families": families, "lower_bounds": lower_bounds, "chunks": chunks,
             "variants": variants, "seeds": seeds, "length": length,
             "long_length": long_length, "heads": heads, "dim": dim}
    changes = {k: v for k, v in given.items() if v is not None}
    names = {k: "--" + k.replace("_", "-") for k in given}
    cfg = labelled(lambda **kw: replace(base, **kw), changes, names)
    out = params.output_folder(out, "--out")
    (out / "config.json").write_text(json.dumps(cfg.as_dict(), indent=1) + "\n")

    costs = {key: cell_cost(cfg, *key) for key in cfg.cell_keys()}
    t0 = time.perf_counter()
    with record_file(out, f"'kdalab run end-to-end --redraw --out {out}' draws the views from "
                          "them; running the same command again starts afresh") as writer, \
            WeightedProgress("cells", cfg.cells(), sum(costs.values()), quiet) as bar:
        def sink(cell: list[dict]) -> None:
            writer.write(cell)
            r = cell[0]
            bar.advance(1, costs[(r["family"], r["variant"], r["chunk"])])

        records = run_study(cfg, sink=sink, device=device)
    elapsed = time.perf_counter() - t0
    with drawing(quiet=quiet):
        from kdalab.views.end_to_end import write_e2e_views

        paths, _ = write_e2e_views(records, out)
    if not quiet:
        console.print(f"{cfg.cells()} cells → {len(records)} records in {elapsed:.1f} s; "
                      f"wrote {len(paths) + 4} files to {out}/", highlight=False)

"""``kdalab run end-to-end``: the layer's output and final-state error against the fp64
recurrent reference, over families, lower bounds, chunk sizes, recipes and tile strategies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import prose, run_app
from kdalab.cli.options import E2E_FAMILIES, Force, Quiet, Redraw, Resume


@run_app.command(
    "end-to-end",
    short_help="The layer's output and state error against fp64, per recipe and chunk.",
    help=prose("""Output and final-state relative error of the chunked
forward against the fp64 recurrent reference. The records go to a store in --out as each cell
finishes (Parquet parts keyed by cell, and a manifest): an interrupted study keeps them and
--resume completes it; a folder holding anything else is refused unless --force. Tables (CSV,
Markdown) and plots (PNG, SVG) are drawn from the stored records; --redraw draws them again."""))
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
    quiet: Quiet = False,
    resume: Resume = False,
    force: Force = False,
    redraw: Redraw = False,
) -> None:
    from dataclasses import replace

    from kdalab import params
    from kdalab.cli.common import labelled
    from kdalab.cli.stored import redraw_study, run_study

    if redraw:
        return redraw_study(out, "end-to-end", _views, quiet=quiet)
    from kdalab.studies.end_to_end import FULL, QUICK, EndToEndStudy

    device = params.device(device, "--device")
    base = QUICK if quick else FULL
    given = {"families": families, "lower_bounds": lower_bounds, "chunks": chunks,
             "variants": variants, "seeds": seeds, "length": length,
             "long_length": long_length, "heads": heads, "dim": dim}
    changes = {k: v for k, v in given.items() if v is not None}
    names = {k: "--" + k.replace("_", "-") for k in given}
    cfg = labelled(lambda **kw: replace(base, **kw), changes, names)
    run_study(EndToEndStudy(cfg, device, names), out, _views, command="end-to-end", resume=resume,
              force=force, quiet=quiet)


def _views(store, show: bool) -> list[Path]:
    from kdalab.cli.common import print_frame
    from kdalab.views.end_to_end import write_e2e_views

    paths, table = write_e2e_views(store.records(), store.folder)
    if show:
        print_frame("Output relative RMSE vs the fp64 recurrence (median over seeds; ∞ where "
                    "any run is non-finite)", table)
    return paths

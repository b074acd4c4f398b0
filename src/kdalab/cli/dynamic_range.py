"""``kdalab safe-chunk`` (the calculator), ``kdalab run dynamic-range`` (the measured phase
diagram) and ``kdalab run diagonal-tile`` (dense diagonal tiles against per-pair ones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, prose, run_app
from kdalab.cli.options import BOUNDARIES, FORMATS, STRATEGIES, Force, Quiet, Redraw, Resume


@app.command(
    "safe-chunk",
    short_help="The largest safe chunk for a lower bound (or the weakest bound for a chunk).",
    help=prose("""The largest chunk length whose split-exponent scale
factors exp(±(G − G_b)) all stay finite and non-zero (and, separately, all normal), with the
arithmetic; exact and instant for every finite lower bound.

Example: kdalab safe-chunk --lower-bound -5 --format bf16 --boundary start → 17. With --chunk N:
the weakest lower bound a chunk of N tokens admits."""))
def safe_chunk_command(
    lower_bound: Annotated[Optional[str], typer.Option(
        "--lower-bound", help="Lower bound lb < 0 of the per-step log-decay, g ∈ (lb, 0)",
        show_default=False)] = None,
    format: Annotated[str, typer.Option(
        "--format", help=f"Scale format: {', '.join(FORMATS)}, any eXmY or 'X,Y' (exponent, "
                         "fraction bits); a -ftz suffix flushes subnormals")] = "bf16",
    boundary: Annotated[str, typer.Option(
        help=f"Where the exponent is split: {', '.join(BOUNDARIES)}")] = "start",
    ftz: Annotated[bool, typer.Option(
        "--ftz/--no-ftz", help="Factors via float32 exp2 with flush-to-zero, then cast (the "
                               "kernels); --no-ftz: exp rounded once to the format")] = True,
    chunk: Annotated[Optional[str], typer.Option(
        help="The inverse question: the weakest lower bound this chunk length admits",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object")] = False,
) -> None:
    from kdalab import params
    from kdalab.kda.safe_chunk import count_text, safe_chunk, weakest_lower_bound

    if lower_bound is None and chunk is None:
        raise ValueError("give --lower-bound (the largest safe chunk) or --chunk (the weakest "
                         "lower bound), or both")
    fmt = params.scale_format(format, "--format")
    boundary = params.choice(boundary, "--boundary", BOUNDARIES)
    lb = None if lower_bound is None else params.lower_bound(lower_bound, "--lower-bound")
    c = None if chunk is None else params.integer(chunk, "--chunk", 1)
    answer = None if lb is None else safe_chunk(fmt, lb, boundary, exp2_ftz=ftz)
    try:
        inverse = None if c is None else weakest_lower_bound(fmt, c, boundary, exp2_ftz=ftz)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None  # the calculator names "chunk"
    if as_json:
        out = answer.to_dict() if answer is not None else inverse.to_dict()
        if answer is not None and inverse is not None:
            out.update(inverse=inverse.to_dict(), chunk=c,
                       chunk_is_safe=answer.max_chunk is None or c <= answer.max_chunk)
        typer.echo(json.dumps(out, indent=1, ensure_ascii=False, allow_nan=False))
        return
    if answer is not None:
        console.print(f"[bold]max chunk: {count_text(answer.max_chunk)}[/] (all factors finite "
                      f"and non-zero); all normal: {count_text(answer.max_chunk_normal)}",
                      highlight=False, soft_wrap=True)
        for line in answer.explanation:
            console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)
    if inverse is not None:
        if inverse.lower_bound is None:
            console.print(f"[bold]C = {count_text(c)}: every lower bound is safe[/]",
                          highlight=False)
        else:
            console.print(f"[bold]C = {count_text(c)}: lower bound must be > "
                          f"{inverse.lower_bound:.6g}[/] (all normal: > "
                          f"{inverse.lower_bound_normal:.6g})", highlight=False, soft_wrap=True)
        for line in inverse.explanation:
            console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)


@run_app.command(
    "dynamic-range",
    short_help="Measured phase diagram: lower bound × chunk × boundary × format.",
    help=prose("""Measured phase diagram of the decay scales:
worst-case (every step at the bound) and model-like inputs over lower bound × chunk size ×
boundary × format. Counts non-finite, zero and subnormal scale factors and the L and inverse
errors; heatmaps with the calculator's boundary drawn over the measurements (about a minute on
two cores)."""))
def run_dynamic_range(
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/dynamic-range"),
    lower_bounds: Annotated[Optional[str], typer.Option(
        help="Lower bounds < 0, comma-separated",
        show_default="22 values from -0.5 to -20")] = None,
    chunks: Annotated[str, typer.Option(
        help="Chunk sizes >= 2: '2-128', '36-64:4' (step 4), '8,16,32'")] = "2-32,36-64:4,72-128:8",
    formats: Annotated[str, typer.Option(
        help="Scale formats, comma-separated (any eXmY too)")] = ",".join(FORMATS),
    boundaries: Annotated[str, typer.Option(
        help="Boundaries, comma-separated")] = ",".join(BOUNDARIES),
    ftz: Annotated[str, typer.Option(help="exp2 flush-to-zero path: on, off or both")] = "on",
    model_seeds: Annotated[str, typer.Option(
        help="Seeds of the model_like family ('' for none)")] = "0,1",
    dim: Annotated[int, typer.Option(help="Head dimension")] = 32,
    inverse_accumulation: Annotated[str, typer.Option(
        help="Accumulation model of the fp16 Neumann inverse")] = "fp32",
    resume: Resume = False,
    force: Force = False,
    redraw: Redraw = False,
    quiet: Quiet = False,
) -> None:
    from kdalab.cli.common import labelled
    from kdalab.cli.stored import redraw_study, run_study
    from kdalab.studies.dynamic_range import DynamicRangeStudy, SweepGrid

    if redraw:
        return redraw_study(out, DynamicRangeStudy.kind, _dynamic_range_views, quiet=quiet)
    names = {"lower_bounds": "--lower-bounds", "chunks": "--chunks", "formats": "--formats",
             "boundaries": "--boundaries", "exp2_ftz": "--ftz", "model_seeds": "--model-seeds",
             "dim": "--dim", "inverse_accumulation": "--inverse-accumulation"}
    raw = {"chunks": chunks, "formats": formats, "boundaries": boundaries, "exp2_ftz": ftz,
           "model_seeds": model_seeds, "dim": dim, "inverse_accumulation": inverse_accumulation}
    if lower_bounds is not None:
        raw["lower_bounds"] = lower_bounds
    study = DynamicRangeStudy(labelled(SweepGrid, raw, names))
    run_study(study, out, _dynamic_range_views, command="dynamic-range", resume=resume,
              force=force, quiet=quiet, noun="chunk sizes", records_option="--model-seeds")


def _dynamic_range_views(store, show: bool) -> list[Path]:
    from kdalab.cli.common import print_frame
    from kdalab.studies.dynamic_range import SweepGrid, calculator
    from kdalab.views.dynamic_range import write_views

    grid = SweepGrid(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in store.manifest.config.items()})
    paths, tables = write_views(store.records(), calculator(grid), store.folder)
    if show:
        for title, frame in tables:
            print_frame(title, frame)
    return paths


@run_app.command(
    "diagonal-tile",
    short_help="Dense diagonal tiles against per-pair ones: error and counted work.",
    help=prose("""Diagonal tile: dense through a fixed boundary
against per pair (and 16-token secondary tiles): the error of the decayed Gram matrix and the
work, counted (exps, GEMM against scalar multiply-adds)."""))
def run_diagonal_tile(
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/diagonal-tile"),
    chunks: Annotated[str, typer.Option(help="Chunk sizes")] = "16,32,64",
    lower_bounds: Annotated[str, typer.Option(help="Lower bounds < 0")] = "-0.5,-1,-2,-5,-8",
    seeds: Annotated[str, typer.Option(help="Seeds of the model_like family")] = "0,1,2",
    strategies: Annotated[str, typer.Option(
        help=f"Tile strategies: {', '.join(STRATEGIES)}")] = ",".join(STRATEGIES),
    dim: Annotated[int, typer.Option(help="Head dimension")] = 64,
    resume: Resume = False,
    force: Force = False,
    redraw: Redraw = False,
    quiet: Quiet = False,
) -> None:
    from kdalab.cli.common import labelled
    from kdalab.cli.stored import redraw_study, run_study
    from kdalab.studies.diagonal_tile import DiagonalTileStudy

    if redraw:
        return redraw_study(out, DiagonalTileStudy.kind, _diagonal_tile_views, quiet=quiet)
    raw = {"chunks": chunks, "strategies": strategies, "lower_bounds": lower_bounds,
           "seeds": seeds, "dim": dim}
    study = labelled(DiagonalTileStudy, raw, {k: "--" + k.replace("_", "-") for k in raw})
    run_study(study, out, _diagonal_tile_views, command="diagonal-tile", resume=resume,
              force=force, quiet=quiet, noun="chunk sizes")


def _diagonal_tile_views(store, show: bool) -> list[Path]:
    from kdalab.cli.common import print_frame
    from kdalab.studies.diagonal_tile import summarize
    from kdalab.views.diagonal_tile import write_diagonal_tile_views
    records = store.records()
    paths = write_diagonal_tile_views(records, store.folder)
    if show:
        tabs = summarize(records)
        for title, frame in (("Work per chunk (counted)", tabs["work"]),
                             ("rel RMSE of P vs float64 per pair (median over seeds; ∞: "
                              "non-finite entries)", tabs["errors_wide"])):
            print_frame(title, frame)
    return paths

"""``kdalab safe-chunk`` (the calculator) and ``kdalab run dynamic-range`` (the measured sweep)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, fail, run_app


def _parse_format(name: str):
    from kdalab.arith import get_format

    spec = name
    bits = name.replace(" ", "").split(",")
    if len(bits) == 2 and all(x.isdigit() for x in bits):  # "5,10": exponent, fraction bits
        spec = (int(bits[0]), int(bits[1]))
    try:
        fmt = get_format(spec)
    except ValueError as exc:
        fail(f"--format: {exc}")
    return fmt


def _check_boundary(boundary: str) -> str:
    from kdalab.kda.dynamic_range import BOUNDARIES

    if boundary not in BOUNDARIES:
        fail(f"--boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")
    return boundary


@app.command("safe-chunk")
def safe_chunk_command(
    lower_bound: Annotated[Optional[float], typer.Option(
        "--lower-bound", help="lower bound lb < 0 of the per-step log-decay, g ∈ (lb, 0)")] = None,
    format: Annotated[str, typer.Option(
        "--format", help="scale format: bf16, fp16, fp32, fp8_e4m3, fp8_e5m2, any eXmY or "
                         "'X,Y' (exponent, fraction bits); suffix -ftz flushes subnormals",
    )] = "bf16",
    boundary: Annotated[str, typer.Option(
        help="where the exponent is split: start, midpoint, end, per_pair")] = "start",
    ftz: Annotated[bool, typer.Option(
        "--ftz/--no-ftz", help="factors via float32 exp2 with flush-to-zero, then cast (the "
                               "kernels); --no-ftz: exp rounded once to the format")] = True,
    chunk: Annotated[Optional[int], typer.Option(
        help="the inverse question: the weakest lower bound this chunk length admits")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON object")] = False,
) -> None:
    """The largest chunk length whose split-exponent scale factors exp(±(G − G_b)) all stay
    finite and non-zero (and, separately, all normal), with the arithmetic.

    Example: kdalab safe-chunk --lower-bound -5 --format bf16 --boundary start  → 17.
    With --chunk N: the weakest lower bound a chunk of N tokens admits.
    """
    from kdalab.kda.dynamic_range import safe_chunk, weakest_lower_bound

    fmt = _parse_format(format)
    boundary = _check_boundary(boundary)
    if lower_bound is None and chunk is None:
        fail("give --lower-bound (largest safe chunk) or --chunk (weakest lower bound), or both")
    if lower_bound is not None and (not math.isfinite(lower_bound) or lower_bound >= 0):
        fail(f"--lower-bound must be a finite number < 0 (g ∈ (lb, 0)), got {lower_bound}")
    if chunk is not None and chunk < 1:
        fail(f"--chunk must be >= 1, got {chunk}")
    out: dict = {}
    answer = inverse = None
    try:
        if lower_bound is not None:
            answer = safe_chunk(fmt, lower_bound, boundary, exp2_ftz=ftz)
            out = answer.to_dict()
        if chunk is not None:
            inverse = weakest_lower_bound(fmt, chunk, boundary, exp2_ftz=ftz)
            if answer is None:
                out = inverse.to_dict()
            else:
                out["inverse"] = inverse.to_dict()
                out["chunk"] = chunk
                out["chunk_is_safe"] = (answer.max_chunk is None or chunk <= answer.max_chunk)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(out, indent=1, ensure_ascii=False, allow_nan=False,
                              default=_jsonable))
        return
    if answer is not None:
        mc = "unbounded" if answer.max_chunk is None else str(answer.max_chunk)
        mn = "unbounded" if answer.max_chunk_normal is None else str(answer.max_chunk_normal)
        console.print(f"[bold]max chunk: {mc}[/] (all factors finite and non-zero); "
                      f"all normal: {mn}", highlight=False)
        for line in answer.explanation:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    if inverse is not None:
        if inverse.lower_bound is None:
            console.print(f"[bold]C = {chunk}: every lower bound is safe[/]", highlight=False)
        else:
            console.print(f"[bold]C = {chunk}: lower bound must be > {inverse.lower_bound:.6f}[/] "
                          f"(all normal: > {inverse.lower_bound_normal:.6f})", highlight=False)
        for line in inverse.explanation:
            console.print(f"  {line}", highlight=False, soft_wrap=True)


def _jsonable(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


@run_app.command("dynamic-range")
def run_dynamic_range(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/dynamic-range"),
    lower_bounds: Annotated[Optional[str], typer.Option(
        help="lower bounds, comma-separated (default: -0.5 … -20, 22 values)")] = None,
    chunks: Annotated[str, typer.Option(
        help="chunk sizes: '2-128', '36-64:4' (step 4), '8,16,32'")] = "2-32,36-64:4,72-128:8",
    formats: Annotated[str, typer.Option(
        help="scale formats, comma-separated")] = "bf16,fp16,fp32,fp8_e4m3,fp8_e5m2",
    boundaries: Annotated[str, typer.Option(
        help="boundaries, comma-separated")] = "start,midpoint,end,per_pair",
    ftz: Annotated[str, typer.Option(
        help="exp2 flush-to-zero path: on, off or both")] = "on",
    model_seeds: Annotated[str, typer.Option(
        help="seeds of the model_like family ('' for none)")] = "0,1",
    dim: Annotated[int, typer.Option(help="head dimension")] = 32,
    inverse_accumulation: Annotated[str, typer.Option(
        help="accumulation model of the fp16 Neumann inverse")] = "fp32",
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Measured phase diagram: worst-case (every step at the bound) and model-like inputs over
    lower bound × chunk size × boundary × format; counts non-finite/zero scale factors, L and INV
    errors; heatmaps with the calculator's boundary drawn over the measurements."""
    from kdalab.experiments.dynamic_range import SweepGrid, calculator, run_sweep
    from kdalab.experiments.store import RecordWriter
    from kdalab.views.dynamic_range import write_views

    try:
        grid = SweepGrid(**({} if lower_bounds is None else {"lower_bounds": lower_bounds}),
                         chunks=chunks, formats=formats, boundaries=boundaries, exp2_ftz=ftz,
                         model_seeds=model_seeds, dim=dim,
                         inverse_accumulation=inverse_accumulation)
    except ValueError as exc:
        fail(str(exc))
    t0 = time.perf_counter()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with RecordWriter(out) as writer, Progress(
        TextColumn("[bold]groups"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=quiet,
    ) as progress:
        task = progress.add_task("groups", total=grid.group_count)
        records = run_sweep(grid, sink=writer.write,
                            progress=lambda d, t: progress.update(task, completed=d))
    elapsed = time.perf_counter() - t0
    calc = calculator(grid)
    paths = write_views(records, calc, out)
    if not quiet:
        console.print(f"{len(records)} records in {elapsed:.1f} s (sweep); views: "
                      f"{len(paths)} files in {out}", highlight=False)


@run_app.command("diagonal-tile")
def run_diagonal_tile(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/diagonal-tile"),
    chunks: Annotated[str, typer.Option(help="chunk sizes")] = "16,32,64",
    lower_bounds: Annotated[str, typer.Option(help="lower bounds")] = "-0.5,-1,-2,-5,-8",
    seeds: Annotated[str, typer.Option(help="seeds of the model_like family")] = "0,1,2",
    dim: Annotated[int, typer.Option(help="head dimension")] = 64,
    quiet: Annotated[bool, typer.Option(help="no tables on the terminal")] = False,
) -> None:
    """Diagonal tile: dense through a fixed boundary vs per pair (and 16-token secondary tiles):
    error of the decayed Gram matrix and the work, counted (exps, GEMM vs scalar multiply-adds)."""
    from kdalab.experiments.diagonal_tile import run_study
    from kdalab.experiments.store import RecordWriter
    from kdalab.views.diagonal_tile import write_diagonal_tile_views

    try:
        ch = [int(x) for x in chunks.split(",")]
        lbs = [float(x) for x in lower_bounds.split(",")]
        sd = [int(x) for x in seeds.split(",")]
    except ValueError as exc:
        fail(f"cannot read a list: {exc}")
    if any(c < 1 for c in ch) or any(not (math.isfinite(lb) and lb < 0) for lb in lbs) or dim < 1:
        fail("chunks and --dim must be >= 1, lower bounds finite and < 0")
    t0 = time.perf_counter()
    try:
        records = run_study(ch, lower_bounds=lbs, seeds=sd, dim=dim)
    except ValueError as exc:
        fail(str(exc))
    with RecordWriter(out) as writer:
        writer.write(records)
    paths = write_diagonal_tile_views(records, out)
    if not quiet:
        console.print((out / "diagonal-tables.md").read_text(encoding="utf-8"), markup=False,
                      highlight=False)
        console.print(f"{len(records)} records in {time.perf_counter() - t0:.1f} s; "
                      f"{len(paths)} files in {out}", highlight=False)

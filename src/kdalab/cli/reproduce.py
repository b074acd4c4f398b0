"""``kdalab reproduce`` and ``kdalab sweep``: the seed's inverse experiment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, fail
from kdalab.cli.common import (
    check_device,
    parse_or_fail,
    run_with_progress,
    write_inverse_views,
)


def _check_accumulation(name: str) -> str:
    from kdalab.arith import get_accumulation

    parse_or_fail(get_accumulation, name)
    return name


@app.command()
def reproduce(
    device: Annotated[str, typer.Option(help="cpu, or cuda (the GPU's own arithmetic)")] = "cpu",
    accumulation: Annotated[Optional[str], typer.Option(
        help="accumulation model of the Neumann products: fp16-seq (the seed's CPU fallback; "
             "default on cpu), fp16-once, h200 (the H200's Tensor Cores: emulated on cpu, the "
             "GPU's own on cuda; default on cuda), h200-mma, fp32, fp64")] = None,
    chunks: Annotated[Optional[str], typer.Option(
        help="chunk sizes for every family, e.g. '8,16,32' (default: the seed's tables)")] = None,
    seeds: Annotated[str, typer.Option(help="seeds, e.g. '0-2' or '0,1,2'")] = "0-2",
    dim: Annotated[int, typer.Option(help="head dimension")] = 128,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/reproduce"),
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Reproduce the seed document's three tables on (I + L)^-1: floor_e-5, weak_decay_correlated
    and model_like inputs across chunk sizes, seeds 0-2, dim 128.

    Writes records (records.jsonl, records.json, records.parquet), the three tables (Markdown and
    CSV) and plots (PNG and SVG) to --out. On cuda, H200 models run as the GPU's own Tensor-Core
    arithmetic (bit-identical to the CPU emulation in L and the inverses).
    """
    from kdalab import params
    from kdalab.experiments.sweep import seed_reproduction_runs

    device = check_device(device)
    if accumulation is None:
        accumulation = "h200" if device.startswith("cuda") else "fp16-seq"
    _check_accumulation(accumulation)
    seed_list = parse_or_fail(params.int_list, seeds, "--seeds", 0)
    chunk_list = parse_or_fail(params.int_list, chunks, "--chunks", 1) if chunks else None
    if dim < 1:
        fail(f"--dim must be >= 1, got {dim}")
    runs = parse_or_fail(lambda: seed_reproduction_runs(seed_list, dim, chunk_list))
    records = run_with_progress(runs, [accumulation], recipe="seed", device=device, out=out,
                                quiet=quiet)
    paths = write_inverse_views(records, out, show=not quiet)
    if not quiet:
        console.print(f"wrote {len(paths) + 3} files to {out}/")


@app.command()
def sweep(
    config: Annotated[Optional[Path], typer.Argument(
        help="a TOML file with the sweep (keys: families, chunks, seeds, dims, accumulations, "
             "lower_bounds); options given on the command line override it")] = None,
    families: Annotated[Optional[str], typer.Option(
        help="floor,weak_decay_correlated,model_like")] = None,
    chunks: Annotated[Optional[str], typer.Option(help="e.g. 4,12,16 or 2-64")] = None,
    seeds: Annotated[Optional[str], typer.Option(help="e.g. 3-8")] = None,
    dims: Annotated[Optional[str], typer.Option(help="e.g. 64,128")] = None,
    accumulation: Annotated[Optional[str], typer.Option(
        help="one or more accumulation models, comma-separated")] = None,
    lower_bound: Annotated[Optional[str], typer.Option(
        help="lower bound(s) of the log-decay (< 0), comma-separated; default -5")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu or cuda")] = None,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/sweep"),
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Run a declarative sweep of the inverse experiment: families × chunks × seeds × dims ×
    accumulation models (× lower bounds), batched."""
    from kdalab.experiments.sweep import SweepConfig, read_sweep_file

    data: dict = {}
    if config is not None:
        data = parse_or_fail(read_sweep_file, config)
    overrides = {"families": families, "chunks": chunks, "seeds": seeds, "dims": dims,
                 "accumulations": accumulation, "lower_bounds": lower_bound, "device": device}
    data.update({k: v for k, v in overrides.items() if v is not None})
    cfg = parse_or_fail(SweepConfig.parse, data)
    check_device(cfg.device)
    runs = cfg.runs()
    records = run_with_progress(runs, list(cfg.accumulations), recipe=cfg.recipe,
                                device=cfg.device, out=out, quiet=quiet)
    paths = write_inverse_views(records, out, show=not quiet)
    if not quiet:
        console.print(f"wrote {len(paths) + 3} files to {out}/")

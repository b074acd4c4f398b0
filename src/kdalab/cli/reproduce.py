"""``kdalab reproduce``: the seed document's three tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app
from kdalab.cli.common import check_device, parse_or_fail, run_into_folder


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
    resume: Annotated[bool, typer.Option(
        help="keep the runs already stored in --out and run the rest")] = False,
    force: Annotated[bool, typer.Option(
        help="replace what --out holds (a different or earlier run)")] = False,
    json: Annotated[bool, typer.Option("--json", help="also export records.json")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Reproduce the seed document's three tables on (I + L)^-1: floor_e-5, weak_decay_correlated
    and model_like inputs across chunk sizes, seeds 0-2, dim 128.

    Stores the records in --out (Parquet parts, resumable: see ``kdalab sweep``), then writes
    the three tables (Markdown and CSV), summary.csv and plots (PNG and SVG) there. On cuda,
    H200 models run as the GPU's own Tensor-Core arithmetic (bit-identical to the CPU
    emulation in L and the inverses).
    """
    from kdalab import params
    from kdalab.experiments.sweep import SweepPlan

    device = check_device(device)
    if accumulation is None:
        accumulation = "h200" if device.startswith("cuda") else "fp16-seq"
    _check_accumulation(accumulation)
    seed_list = parse_or_fail(params.int_list, seeds, "--seeds", 0)
    chunk_list = parse_or_fail(params.int_list, chunks, "--chunks", 1) if chunks else None
    dim = parse_or_fail(params.integer, dim, "--dim", 1)
    plan = parse_or_fail(SweepPlan.seed_tables, seed_list, dim, chunk_list, [accumulation],
                         device)
    run_into_folder(plan, out, resume=resume, force=force, quiet=quiet, json_export=json)

"""``kdalab reproduce``: the seed document's three tables on (I + L)^-1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, prose
from kdalab.cli.options import Force, Quiet, accumulation_help


@app.command(
    short_help="The seed document's three tables (the H200's numbers by default).",
    help=prose("""Reproduce the seed document's three tables on (I + L)^-1:
floor_e-5, weak_decay_correlated and model_like inputs across chunk sizes, seeds 0-2, dim 128.

The default, --accumulation h200, is the H200's Tensor-Core arithmetic emulated bit for bit on
the CPU: every value of the published tables (measured on an H200). --accumulation fp16-seq is
the seed code's own CPU fallback (an fp16 accumulator rounded after every product), which gives
other values where rounding matters. On --device cuda an h200 model runs as the GPU's own
arithmetic, with the same bits.

Stores the records in --out (Parquet parts keyed by run, resumable: see 'kdalab sweep'), then
draws the three tables (Markdown and CSV), summary.csv and a plot (PNG and SVG) there, and
ends with its verdict: how many of the document's 76 published values the tables reproduce, as
printed (exit code 1, naming those that differ, when not all)."""))
def reproduce(
    accumulation: Annotated[str, typer.Option(
        help=accumulation_help("Accumulation model of the Neumann products"))] = "h200",
    device: Annotated[str, typer.Option(
        help="cpu, cuda or cuda:N (the GPU's own arithmetic)")] = "cpu",
    chunks: Annotated[Optional[str], typer.Option(
        help="Chunk sizes for every family, e.g. '8,16,32' or '8-48:8'",
        show_default="the seed's tables")] = None,
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. '0-2' or '0,1,2'")] = "0-2",
    dim: Annotated[int, typer.Option(help="Head dimension")] = 128,
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/reproduce"),
    resume: Annotated[bool, typer.Option(
        "--resume", help="Keep the runs already stored in --out and run the rest (the default "
        "when --out holds this command's store)")] = False,
    force: Force = False,
    json: Annotated[bool, typer.Option(
        "--json", help="Also export every record to records.json")] = False,
    quiet: Quiet = False,
) -> None:
    from kdalab import params
    from kdalab.cli.sweep import run_plan
    from kdalab.errors import Unavailable
    from kdalab.records import is_store
    from kdalab.studies.plan import STORE_KIND
    from kdalab.studies.sweep import SweepPlan

    try:  # every option parsed once, by the plan
        plan = SweepPlan.seed_tables(seeds, dim, chunks, [accumulation], device)
    except (ValueError, Unavailable) as exc:
        raise params.renamed(exc, {"chunks": "--chunks", "dim": "--dim", "seeds": "--seeds",
                                   "device": "--device",
                                   "accumulations": "--accumulation"}) from None
    out = params.output_folder(out, "--out", create=False)
    if not force and is_store(out, STORE_KIND):
        # the main job is idempotent: run again, it keeps what its store holds and runs the rest
        # (a store of other options is still refused, with how to replace it)
        resume = True
    paths = run_plan(plan, out, resume=resume, force=force, quiet=quiet, json_export=json,
                     again="kdalab reproduce (the same options) --out {out} --resume",
                     what="reproduce")
    if not quiet:
        console.print(f"wrote {len(paths)} files to {out}/", highlight=False)
    _verdict(out, plan, chunks is None, quiet)


def _verdict(out: Path, plan, seed_chunks: bool, quiet: bool) -> None:
    """The last line: how many of the seed document's published values the tables reproduce,
    compared as printed (exit code 1 and the ones that differ, when not all); nothing to
    compare when the configuration is not the document's (other chunks, seeds or dim)."""
    from kdalab.records import StoreReader
    from kdalab.views.sweep_views import seed_verdict

    if not seed_chunks or tuple(plan.seeds) != (0, 1, 2) or {d for _, d, _ in plan.cells} != {128}:
        if not quiet:
            console.print("not the seed document's configuration (its chunk sizes, seeds 0-2, "
                          "dim 128): no published values to compare with", highlight=False)
        return
    same, total, differ = seed_verdict(StoreReader.read_only(out))
    if not differ:
        if not quiet:
            console.print(f"[bold green]{same} of {total} published values reproduced[/]",
                          highlight=False)
        return
    console.print(f"[bold red]{same} of {total} published values reproduced[/]; these differ: "
                  + "; ".join(differ), highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)

"""``kdalab sweep``: a declarative sweep of the inverse experiment, from options and/or TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, prose
from kdalab.cli.options import FAMILIES, accumulation_help

_DEFAULT_OUT = Path("results/sweep")


@app.command(
    short_help="A declarative sweep of the inverse experiment (options or TOML).",
    help=prose("""Run a declarative sweep of the inverse experiment: families × chunk
sizes × seeds × dims × accumulation models (× lower bounds for the families that use one),
batched; records, the seed's tables per configuration and a plot go to --out.

CONFIG is a TOML file whose keys are the options' names (dashes or underscores; plural forms
work too), e.g. chunks = "4-16:4", lower-bound = [-5, -2], out = "results/x". Options given on
the command line override the file."""))
def sweep(
    config: Annotated[Optional[Path], typer.Argument(
        help="TOML file with the sweep (keys as the options)", show_default=False)] = None,
    families: Annotated[Optional[str], typer.Option(
        help=f"Input families: {', '.join(FAMILIES)}",
        show_default=",".join(FAMILIES))] = None,
    chunks: Annotated[Optional[str], typer.Option(
        help="Chunk sizes: '4,12,16', '2-64' or '8-64:8'", show_default="8,16,32")] = None,
    seeds: Annotated[Optional[str], typer.Option(
        help="Seeds: '3-8' or '0,1,2'", show_default="0-2")] = None,
    dims: Annotated[Optional[str], typer.Option(
        help="Head dimensions: '64,128'", show_default="128")] = None,
    accumulation: Annotated[Optional[str], typer.Option(
        help=accumulation_help("One or more accumulation models, comma-separated"),
        show_default="fp16-seq")] = None,
    lower_bound: Annotated[Optional[str], typer.Option(
        help="Lower bound(s) of the log-decay, each a finite number < 0, comma-separated",
        show_default="-5")] = None,
    device: Annotated[Optional[str], typer.Option(
        help="cpu, cuda or cuda:N", show_default="cpu")] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="Output folder", show_default=str(_DEFAULT_OUT))] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="No progress or tables on the terminal")] = False,
) -> None:
    from kdalab import params
    from kdalab.cli.common import run_with_progress, write_inverse_views
    from kdalab.experiments.sweep import SweepConfig, option_field, read_sweep_file

    data: dict = {}
    labels: dict = {}
    out_label = "--out"
    if config is not None:
        path = params.config_file(config, "config")
        for key, value in read_sweep_file(path).items():
            if option_field(key) == "out":
                out, out_label = (value, f"{path.name}: {key}") if out is None else (out, "--out")
                continue
            data[key], labels[key] = value, f"{path.name}: {key}"
    options = {"--families": families, "--chunks": chunks, "--seeds": seeds, "--dims": dims,
               "--accumulation": accumulation, "--lower-bound": lower_bound, "--device": device}
    for option, value in options.items():
        if value is None:
            continue
        for key in [k for k in data if option_field(k) == option_field(option)]:
            del data[key]  # the command line overrides the file
        data[option], labels[option] = value, option
    cfg = SweepConfig.parse(data, labels)
    out = params.output_folder(_DEFAULT_OUT if out is None else out, out_label)
    records = run_with_progress(cfg.runs(), cfg.accumulations, recipe=cfg.recipe,
                                device=cfg.device, out=out, quiet=quiet,
                                resume_hint="run the same command again to redo the sweep (it "
                                "starts afresh)")
    paths = write_inverse_views(records, out, show=not quiet)
    if not quiet:
        console.print(f"wrote {len(paths) + 3} files to {out}/", highlight=False)

"""``kdalab sweep``: a declarative sweep of the inverse experiment into a resumable store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, fail
from kdalab.cli.common import check_device, draw_views, export_json, parse_or_fail, run_into_folder

DEFAULT_OUT = Path("results/sweep")


@app.command()
def sweep(
    config: Annotated[Optional[Path], typer.Argument(
        help="a TOML file with the sweep (keys as the options: families, chunks, seeds, dims, "
             "accumulation, lower-bound, device, out); options given here override it")] = None,
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
    out: Annotated[Optional[Path], typer.Option(
        help=f"the sweep's folder (records, tables, plots); default {DEFAULT_OUT}")] = None,
    resume: Annotated[bool, typer.Option(
        help="continue the sweep stored in --out: its stored runs are kept, the rest run "
             "(without sweep options: the stored sweep's own)")] = False,
    force: Annotated[bool, typer.Option(
        help="replace what --out holds (another sweep, or files of an earlier kdalab)")] = False,
    backend: Annotated[str, typer.Option(
        help="local (this process) or ray (Ray tasks: every GPU or CPU of the machine, or of "
             "the cluster at --address; pip install 'kdalab[ray]')")] = "local",
    address: Annotated[Optional[str], typer.Option(
        help="a Ray cluster to join (host:port, or auto); default: start one here")] = None,
    json: Annotated[bool, typer.Option(
        "--json", help="also export every record to records.json")] = False,
    redraw: Annotated[Optional[Path], typer.Option(
        help="draw the tables and plots again from the records stored in this folder")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Run a declarative sweep of the inverse experiment: families × chunks × seeds × dims ×
    accumulation models (× lower bounds), batched.

    Records go to a store in --out as they are computed (Parquet parts keyed by run, with a
    manifest of the sweep): a sweep that is killed keeps every finished part, and --resume
    completes it with exactly the records of an uninterrupted run. A folder holding another
    sweep is refused unless --force. Tables and plots are drawn once, at the end, from the
    stored records (--redraw draws them again).
    """
    axes = {"families": families, "chunks": chunks, "seeds": seeds, "dims": dims,
            "accumulation": accumulation, "lower_bound": lower_bound, "device": device}
    given = {k: v for k, v in axes.items() if v is not None}
    if redraw is not None:
        if given or config is not None or out is not None or resume or force:
            fail("--redraw draws from the stored records: give it alone (with --json or "
                 "--quiet)")
        _redraw(redraw, json, quiet)
        return
    from kdalab.experiments.backends import check_backend

    parse_or_fail(check_backend, backend, address)
    data: dict = {}
    if config is not None:
        from kdalab.experiments.sweep import read_sweep_file

        data = parse_or_fail(read_sweep_file, config)
    toml_out = data.pop("out", None)
    out = out or (Path(toml_out) if toml_out else DEFAULT_OUT)
    if resume and config is None and not given:
        plan = _stored_plan(out, device)
    else:
        from kdalab.experiments.sweep import SweepConfig, SweepPlan

        labels = {k: f"{config}: {k}" for k in data}
        data.update(given)
        labels.update({k: "--" + k.replace("_", "-") for k in given})
        cfg = parse_or_fail(SweepConfig.parse, data, labels)
        check_device(cfg.device)
        plan = SweepPlan.of(cfg)
    run_into_folder(plan, out, resume=resume, force=force, backend=backend, address=address,
                    quiet=quiet, json_export=json)


def _stored_plan(out: Path, device: str | None):
    """The plan of the sweep stored in ``out`` (for ``--resume`` without sweep options)."""
    from kdalab.experiments.runstore import RunStore, StoreError
    from kdalab.experiments.sweep import STORE_KIND, SweepPlan

    try:
        manifest = RunStore.read_only(out).manifest
    except StoreError as exc:
        fail(f"--resume: {exc}")
    if manifest.kind != STORE_KIND:
        fail(f"--resume: {out} holds a {manifest.kind}, not an inverse sweep")
    return parse_or_fail(SweepPlan.from_identity, manifest.config, device)


def _redraw(folder: Path, json_export: bool, quiet: bool) -> None:
    from kdalab.experiments.runstore import RunStore, StoreError

    try:
        store = RunStore.read_only(folder, lock=True)
    except StoreError as exc:
        fail(f"--redraw: {exc}")
    with store:
        stored = int(store.done.sum())
        if not quiet and not store.complete:
            console.print(f"{folder} holds {stored} of {store.runs} runs (kdalab sweep --out "
                          f"{folder} --resume completes it); drawing from those")
        paths = draw_views(store, show=not quiet)
        if json_export:
            paths.append(export_json(store, folder / "records.json"))
    if not quiet:
        console.print(f"wrote {len(paths)} file(s) to {folder}/ from {stored} stored runs")

"""``kdalab sweep``: a declarative sweep of the inverse experiment, from options and/or TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, mark, prose
from kdalab.cli.options import FAMILIES, Force, Quiet, Redraw, accumulation_help

_DEFAULT_OUT = Path("results/sweep")


@app.command(
    short_help="A declarative sweep of the inverse experiment (options or TOML).",
    help=prose("""Run a declarative sweep of the inverse experiment: families × chunk
sizes × seeds × dims × accumulation models (× lower bounds for the families that use one),
batched.

The records go to a store in --out as they are computed (Parquet parts keyed by run, and a
manifest of the sweep): a sweep that is stopped or killed keeps every finished part, and
--resume completes it with exactly the records of an uninterrupted run. A folder holding another
sweep (or files that are not a sweep's) is refused unless --force. The seed's tables per
configuration, summary.csv and a plot are drawn once, at the end, from the stored records;
--redraw --out DIR draws them again. --backend ray runs the batches as Ray tasks on every GPU
(or CPU) of this machine, or of the cluster at --address; the records are the same bit for bit.

CONFIG is a TOML file whose keys are the options' names (dashes or underscores; plural forms
work too), e.g. chunks = "4-16:4", lower-bound = [-5, -2], out = "results/x", backend = "ray",
and recipe; every option but --resume, --force and --redraw (what one run does with its folder).
Options given on the command line override the file."""))
def sweep(
    ctx: typer.Context,
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
        help="The sweep's folder (records, tables, plots)",
        show_default=str(_DEFAULT_OUT))] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the sweep stored in --out: its runs are kept, the rest run "
        "(with no sweep options: the stored sweep's own)")] = False,
    force: Force = False,
    backend: Annotated[str, typer.Option(
        help="local (this process) or ray (Ray tasks on every GPU or CPU; pip install "
        "'kdalab[ray]')")] = "local",
    address: Annotated[Optional[str], typer.Option(
        help="The Ray cluster to join (host:port or auto)",
        show_default="a new one on this machine")] = None,
    json: Annotated[bool, typer.Option(
        "--json", help="Also export every record to records.json")] = False,
    redraw: Redraw = False,
    quiet: Quiet = False,
) -> None:
    from kdalab import params
    from kdalab.cli.stored import given_options
    from kdalab.runner import check_backend
    from kdalab.studies.sweep import option_field, read_sweep_file

    given = {"--families": families, "--chunks": chunks, "--seeds": seeds, "--dims": dims,
             "--accumulation": accumulation, "--lower-bound": lower_bound, "--device": device}
    if redraw:
        from kdalab.cli.stored import refuse_with_redraw

        refuse_with_redraw(keep=("redraw", "out", "json", "quiet"))
        _redraw(params.user_path(_DEFAULT_OUT if out is None else out, "--out"), json, quiet)
        return
    data: dict = {}
    labels: dict = {}
    out_label = "--out"
    if config is not None:
        path = params.config_file(config, "config")
        run_options = {"backend": backend, "address": address, "json": json, "quiet": quiet}
        for key, value in read_sweep_file(path).items():
            label, field = f"{path.name}: {key}", option_field(key)
            _known_key(ctx.command, field, label)
            if field == "out":  # checked even when --out overrides it
                value = params.user_path(value, label)
                out, out_label = (value, label) if out is None else (out, "--out")
            elif field in run_options:  # how to run, not what: the command line's wins
                value = _run_option(field, value, label)  # checked even when overridden
                if f"--{field}" not in given_options():
                    run_options[field] = value
            else:
                data[key], labels[key] = value, label
        backend, address, json, quiet = (run_options[k] for k in
                                         ("backend", "address", "json", "quiet"))
    check_backend(backend, address)
    for option, value in given.items():
        if value is None:
            continue
        for key in [k for k in data if option_field(k) == option_field(option)]:
            del data[key]  # the command line overrides the file
        data[option], labels[option] = value, option
    out = Path(_DEFAULT_OUT if out is None else out)
    if resume and all(option_field(k) == "device" for k in data):  # the sweep stored in --out
        plan = _stored_plan(out, device)
    else:
        plan = _plan(data, labels, backend, address)
    mark(f"planned: {len(plan)} runs")
    if backend == "ray":  # the cluster joined (or started) before anything is written
        from kdalab.runner.ray import ray_cluster

        ray_cluster(address)
    out = params.output_folder(out, out_label, create=False)  # the store makes it
    paths = run_plan(plan, out, resume=resume, force=force, backend=backend, address=address,
                     quiet=quiet, json_export=json)
    if not quiet:
        console.print(f"wrote {len(paths)} files to {out}/", highlight=False)


#: the command's options that say what one invocation does with its folder: not file keys
_NOT_KEYS = ("config", "resume", "force", "redraw")


def file_keys(command) -> dict[str, str]:
    """The keys a sweep file takes, derived from the ``command``'s options (those that say
    what to sweep, where, and how to run it; not what to do with the folder) and the sweep's
    configuration: field -> the key as it is spelled (the option's name)."""
    import dataclasses

    from kdalab.studies.sweep import SweepConfig, option_field

    keys = {option_field(p.name): p.opts[0].lstrip("-") for p in command.params
            if p.name not in _NOT_KEYS}
    for f in dataclasses.fields(SweepConfig):  # fields without an option (the recipe)
        keys.setdefault(f.name, f.name.replace("_", "-"))
    return keys


def _known_key(command, field: str, label: str) -> None:
    keys = file_keys(command)
    if field not in keys:
        raise ValueError(f"{label}: unknown key; expected one of {', '.join(keys.values())} "
                         "(dashes or underscores; plural forms work too)")


def _run_option(field: str, value, label: str):
    """A file's ``backend``, ``address``, ``json`` or ``quiet``, parsed as the option is."""
    from kdalab import params
    from kdalab.runner.ray import BACKENDS

    if field == "backend":
        return params.choice(value, label, BACKENDS)
    if field == "address":
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{label} must be host:port or auto, got {value!r}")
        return value.strip()
    if not isinstance(value, bool):
        raise ValueError(f"{label} must be true or false, got {value!r}")
    return value


def run_plan(plan, out: Path, *, resume: bool = False, force: bool = False,
             backend: str = "local", address: str | None = None, quiet: bool = False,
             json_export: bool = False, again: str = "kdalab sweep --out {out} --resume",
             what: str = "sweep") -> list[Path]:
    """An inverse sweep's ``plan`` into its store in ``out`` (progress weighted by each run's
    estimated cost), then its views (and ``records.json`` with ``json_export``); ``sweep`` and
    ``reproduce`` alike."""
    from kdalab.cli.stored import export_json, run_into_folder, sweep_views
    from kdalab.studies.sweep import record_cost

    names = [m.name for m in plan.accumulations]

    def weight(batch) -> float:
        run = batch.runs[0]
        return len(batch.runs) * sum(record_cost(run.chunk, run.dim, n) for n in names)

    total = sum(len(pairs) * len(plan.seeds) * sum(record_cost(c, d, n) for n in names)
                for c, d, pairs in plan.cells)
    paths, _, _ = run_into_folder(
        plan, out, draw=sweep_views, again=again, resume=resume, force=force,
        backend=backend, address=address, quiet=quiet, weight=weight, total=total, what=what,
        summary=lambda ran, seconds: f"{ran} runs × {len(names)} accumulation model(s) in "
                                     f"{seconds:.1f} s; {len(plan)} runs stored in {out}/")
    if json_export:
        from kdalab.records import StoreReader

        paths.append(export_json(StoreReader.read_only(out), out / "records.json"))
    return paths


def _plan(data: dict, labels: dict, backend: str, address: str | None):
    """The sweep's plan. Joining a Ray cluster, ``--device cuda`` needs GPUs on its workers,
    not here: the options are checked as for the CPU and the plan runs on the workers' CUDA."""
    import dataclasses

    from kdalab.studies.sweep import SweepConfig, SweepPlan, option_field

    device_keys = [k for k in data if option_field(k) == "device"]
    requested = str(data[device_keys[0]]).strip() if device_keys else ""
    if backend == "ray" and address is not None and requested.startswith("cuda"):
        import re

        if not re.fullmatch(r"cuda(:\d+)?", requested):
            raise ValueError(f"{labels[device_keys[0]]} must be cpu, cuda or cuda:N; got "
                             f"{requested!r}")
        plan = SweepPlan.of(SweepConfig.parse({**data, device_keys[0]: "cpu"}, labels))
        return dataclasses.replace(plan, device="cuda")
    return SweepPlan.of(SweepConfig.parse(data, labels))


def _stored_plan(out: Path, device: str | None):
    """The plan of the sweep stored in ``out`` (``--resume`` without sweep options)."""
    from kdalab.records import RunStore, StoreError
    from kdalab.studies.plan import STORE_KIND
    from kdalab.studies.sweep import SweepPlan

    try:
        manifest = RunStore.read_only(out).manifest
    except StoreError as exc:
        raise ValueError(f"--resume: {exc}; give the sweep's options to start it") from None
    if manifest.kind != STORE_KIND:
        raise ValueError(f"--resume: {out} holds a {manifest.kind}, not an inverse sweep")
    return SweepPlan.from_identity(manifest.config, device)


def _redraw(folder: Path, json_export: bool, quiet: bool) -> None:
    from kdalab.cli.stored import export_json, redraw_folder, sweep_views
    from kdalab.records import StoreReader
    from kdalab.studies.plan import STORE_KIND

    paths, stored = redraw_folder(folder, STORE_KIND, sweep_views, quiet=quiet)
    if json_export:
        paths.append(export_json(StoreReader.read_only(folder), folder / "records.json"))
    if not quiet:
        console.print(f"wrote {len(paths)} files to {folder}/ from {stored} stored runs",
                      highlight=False)

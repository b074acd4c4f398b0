"""``kdalab check``: the accuracy and conformance report card of KDA forward kernels."""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import app, console, err_console

_EPILOG = (
    "Kernels: kdalab, kdalab-tf32 (Triton; CUDA), fla, fla-recurrent (fla's chunk and fused "
    "recurrent KDA; CUDA), flashkda (flash_kda.fwd; CUDA, K = V = 128), recipe:NAME (a "
    "kdalab.kda recipe, e.g. recipe:flashkda, recipe:fla, recipe:fp32; CPU or CUDA), or "
    "module:function / file.py:function with chunk_kda_fwd's convention (docs/check.md). "
    "Exit codes: 0 every supported case meets the thresholds, 1 some case fails, 2 usage error."
)


def fail(message: str) -> None:
    """A usage error: ``error: <message>`` as one line on stderr (never wrapped, brackets kept
    as text), exit code 2."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _versions() -> dict:
    import importlib.metadata

    import torch

    out = {}
    for dist, module in (("kdalab", "kdalab"), ("torch", "torch"), ("triton", "triton"),
                         ("fla-core", "fla"), ("flash_kda", "flash_kda")):
        if module not in sys.modules:
            continue
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = getattr(sys.modules[module], "__version__", "?")
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5, cwd=Path(__file__).parent)
        if commit.returncode == 0:
            out["kdalab commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out}: cannot create the folder ({exc.strerror or exc})")


def _jsonable(value):
    """JSON-safe: NaN as null, ±inf as strings (as the record store writes them)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


@app.command("check", epilog=_EPILOG)
def check_command(
    kernels: Annotated[Optional[list[str]], typer.Argument(
        help="kernels to check (see below)", show_default=False)] = None,
    suite: Annotated[Optional[str], typer.Option(
        help="quick (small, CPU-friendly) or full; default: full on cuda, quick on cpu",
        show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option(
        help="cpu or cuda; default: cuda when available", show_default=False)] = None,
    cases: Annotated[Optional[str], typer.Option(
        help="only the cases matching these comma-separated shell patterns, e.g. "
             "'model_like,varlen/*'", show_default=False)] = None,
    max_output_error: Annotated[float, typer.Option(
        help="largest output relative error a case may have")] = 1e-2,
    max_state_error: Annotated[float, typer.Option(
        help="largest final-state relative error a case may have")] = 1e-2,
    against: Annotated[Optional[str], typer.Option(
        help="fidelity mode: compare with this kernel instead of the fp64 recurrence",
        show_default=False)] = None,
    min_identical: Annotated[float, typer.Option(
        help="fidelity mode: smallest fraction of bit-identical output elements")] = 0.999,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/check"),
    as_json: Annotated[bool, typer.Option(
        "--json", help="print the summary and records as JSON instead of tables")] = False,
    isolate: Annotated[Optional[bool], typer.Option(
        "--isolate/--no-isolate",
        help="run each kernel in a process of its own, so that one which faults the GPU, dies "
             "or hangs is recorded as crashed and the others still run; default: on for cuda",
        show_default=False)] = None,
    kernel_timeout: Annotated[float, typer.Option(
        help="with --isolate: seconds a kernel may take for the whole suite (0: no limit)")]
    = 0.0,
    list_cases: Annotated[bool, typer.Option(
        "--list", help="list the suite's cases and the kernels, run nothing")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Accuracy and conformance report card: run each KERNEL on a suite of cases (families ×
    shapes × options) and measure its output and final state against the fp64 token recurrence
    (or, with --against, against another kernel bit for bit).

    Writes records (records.jsonl/json/parquet), check.json (the run), report.md, report.html
    (self-contained, plot embedded) and errors.png to --out.
    """
    from kdalab.check import (
        ConventionError,
        DeviceFault,
        KernelUnavailable,
        Thresholds,
        get_suite,
        load_kernel,
        run_check,
        select_cases,
    )
    from kdalab.check.adapters import KERNEL_HELP
    from kdalab.cli.common import check_device

    device = check_device(device or _default_device())
    suite = suite or ("full" if device.startswith("cuda") else "quick")
    try:
        selected = select_cases(get_suite(suite), cases)
        thresholds = Thresholds(max_output_error, max_state_error, min_identical)
    except ValueError as exc:
        fail(str(exc).replace("max_output_error", "--max-output-error")
             .replace("max_state_error", "--max-state-error")
             .replace("min_identical", "--min-identical"))
    if list_cases:
        for case in selected:
            typer.echo(f"{case.name:24s} {case.about}")
        typer.echo(KERNEL_HELP)
        return
    if not kernels:
        fail(f"give at least one kernel; {KERNEL_HELP}")
    if len(set(kernels)) != len(kernels):
        fail(f"a kernel is named twice: {' '.join(kernels)}")
    if against is not None and against in kernels:
        fail(f"--against {against}: also among the kernels checked")
    loaded = []
    for spec in kernels + ([against] if against is not None else []):
        try:
            kernel = load_kernel(spec)
            kernel.check_available(device)
        except (ValueError, KernelUnavailable, ConventionError) as exc:
            fail(str(exc))
        loaded.append(kernel)
    reference = loaded.pop() if against is not None else None
    if not (math.isfinite(kernel_timeout) and kernel_timeout >= 0):
        fail(f"--kernel-timeout must be a number of seconds >= 0, got {kernel_timeout}")
    isolate = device.startswith("cuda") if isolate is None else isolate
    _check_out(out)

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kdalab.check import records as store
    from kdalab.check.isolate import run_isolated
    from kdalab.views.check import notes, terminal_table, write_check_views

    meta = {"command": " ".join(["kdalab", "check", *sys.argv[2:]]) if sys.argv[1:2] == ["check"]
            else "kdalab check " + " ".join(kernels),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device_name": _device_name(device), "suite": suite,
            "kernels": kernels, "against": against, "isolated": isolate,
            "cases": [c.name for c in selected],
            "thresholds": ({"min identical": min_identical} if against else
                           {"output": max_output_error, "state": max_state_error})}
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    quiet_run = quiet or as_json
    try:
        with store.writer(out) as writer, Progress(
            TextColumn("[bold]check"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.description}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=True, disable=quiet_run,
        ) as progress:
            task = progress.add_task("", total=len(selected) * len(loaded))

            def show(done, total, label):
                progress.update(task, completed=done, description=label)

            if isolate:
                records = run_isolated(
                    [k.name for k in loaded], selected, suite=suite, device=device,
                    thresholds=thresholds, against=against, folder=out, sink=writer.write,
                    progress=show, timeout=kernel_timeout or None, timings=timings)
            else:
                records = run_check(
                    loaded, selected, device=device, thresholds=thresholds, against=reference,
                    sink=writer.write, timings=timings, progress=show)
    except ConventionError as exc:
        fail(f"{exc} (records so far are in {out}/records.jsonl)")
    except DeviceFault as exc:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(str(exc))}; records so far are in "
                          f"{out}/records.jsonl (--isolate runs each kernel in its own "
                          f"process and records the crash)", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        err_console.print(f"interrupted: the records so far are in {out}/records.jsonl",
                          highlight=False)
        raise typer.Exit(code=130) from None
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    meta["seconds_per_kernel"] = {k: round(v, 1) for k, v in timings.items()}
    meta["versions"] = _versions()
    (out / "check.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    paths = write_check_views(records, meta, out)
    failed = any(r["status"] in ("fail", "skipped") for r in records)
    if as_json:
        from kdalab.views.check import summary

        doc = {"passed": not failed, "meta": meta,
               "summary": summary(records).to_dict("records"), "records": records}
        typer.echo(json.dumps(_jsonable(doc), indent=1, default=str, allow_nan=False))
    elif not quiet:
        console.print(terminal_table(records, title=f"kdalab check — {suite} suite on "
                                     f"{meta['device_name']}"))
        for line in notes(records):
            console.print(f"  {line}", highlight=False, markup=False)
        verdict = "[bold red]FAIL[/]" if failed else "[bold green]PASS[/]"
        console.print(f"{verdict}: {len(records)} records in {meta['elapsed_s']} s; wrote "
                      f"{len(paths) + 4} files to {out}/ ({paths[-1].name})", highlight=False)
    if failed:
        raise typer.Exit(code=1)

"""``kdalab check``: the accuracy and conformance report card of KDA forward kernels."""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import STATE, app, console, err_console

_EPILOG = (
    "Kernels: kdalab, kdalab-tf32, kdalab-fp32 (Triton; CUDA; -fp32: every product 3xTF32, "
    "for training), kdalab-gluon (its Gluon stage 2; Hopper), "
    "fla, fla-recurrent (fla's chunk and fused "
    "recurrent KDA; CUDA), flashkda (flash_kda.fwd; CUDA, K = V = 128), recipe:NAME (a "
    "kdalab.kda recipe, e.g. recipe:flashkda, recipe:fla, recipe:fp32; CPU or CUDA), or "
    "module:function / file.py:function with chunk_kda_fwd's convention (docs/check.md). "
    "Exit codes: 0 every supported case passes, 1 some case fails (or a kernel ran no case), "
    "2 usage error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."
)


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
    if os.environ.get("KDALAB_COMMIT"):  # a copy of the tree whose git metadata is not its own
        out["kdalab commit"] = os.environ["KDALAB_COMMIT"]
        return out
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                                capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent)
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


#: seconds a kernel may go without finishing a case (its worker's start and compilation
#: included) before it is recorded as crashed: on the H200 fla, the slowest kernel, takes 209 s
#: for the full suite's 36 cases, autotuning included, and a CPU case of the quick suite takes
#: seconds, so that only a kernel that hangs meets it (docs/check.md, "Isolation")
DEFAULT_CASE_TIMEOUT = 600.0


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
    budget: Annotated[float, typer.Option(
        help="largest error a case may have, as a multiple of its floor (the error of the fp32 "
             "token recurrence on the same bf16 inputs, rounded as the kernel's output)")]
    = 5.0,  # kdalab.check.budget.DEFAULT_BUDGET (not imported here: it needs torch)
    max_output_error: Annotated[Optional[float], typer.Option(
        help="also an absolute limit on the output relative error", show_default=False)]
    = None,
    max_state_error: Annotated[Optional[float], typer.Option(
        help="also an absolute limit on the final-state relative error", show_default=False)]
    = None,
    inputs: Annotated[Optional[Path], typer.Option(
        help="grade captured inputs instead of the suite: a safetensors file or a folder of "
             "them (kdalab.check.capture writes them; docs/check.md)", show_default=False)]
    = None,
    force: Annotated[bool, typer.Option(
        "--force", help="write into a non-empty --out that holds no check run")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue the check stored in --out (the same kernels and options): "
        "its records are kept and only the (kernel, case) pairs without one run")] = False,
    against: Annotated[Optional[str], typer.Option(
        help="fidelity mode: compare with this kernel instead of the fp64 recurrence",
        show_default=False)] = None,
    min_identical: Annotated[float, typer.Option(
        help="fidelity mode: smallest fraction of bit-identical output elements")] = 0.999,
    grad: Annotated[bool, typer.Option("--grad", help="also judge every gradient")] = False,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/check"),
    as_json: Annotated[bool, typer.Option(
        "--json", help="print the summary and records as JSON instead of tables")] = False,
    exclude: Annotated[Optional[list[str]], typer.Option(
        help="KERNEL=PATTERNS: do not run KERNEL on the matching cases (recorded as excluded; "
             "repeatable), e.g. 'fla=dims/*'", show_default=False)] = None,
    isolate: Annotated[bool, typer.Option(
        "--isolate/--no-isolate",
        help="run each kernel in a process of its own, so that one which faults the GPU, dies "
             "or hangs is recorded as crashed and the others still run (about 2 s per "
             "kernel); --no-isolate runs them in this process, without a --case-timeout")]
    = True,
    case_timeout: Annotated[Optional[float], typer.Option(
        help=f"seconds a kernel may take for one case, its start and compilation included "
             f"(default {DEFAULT_CASE_TIMEOUT:g}; 0: no limit); then it is killed, that case "
             f"is recorded as crashed and the check goes on", show_default=False)] = None,
    redraw: Annotated[bool, typer.Option(
        "--redraw", help="run nothing: redraw the report from the records already in --out")]
    = False,
    list_cases: Annotated[bool, typer.Option(
        "--list", help="list the suite's cases and the kernels, run nothing")] = False,
    quiet: Annotated[bool, typer.Option(help="no progress or tables on the terminal")] = False,
) -> None:
    """Accuracy and conformance report card: run each KERNEL on a suite of cases (families ×
    shapes × options) and measure its output and final state against the fp64 token recurrence
    (--grad: its gradients too; --against: another kernel instead, bit for bit).

    Writes the records to a store in --out (Parquet parts and a manifest, as cases finish: an
    interrupted run keeps them, and --resume completes it), check.json (the run), records.json
    (the records for people), report.md, report.html (self-contained, plot embedded) and
    errors.png.
    """
    from kdalab import params
    from kdalab.check import records as store
    from kdalab.cli.common import default_device
    from kdalab.cli.stored import refuse_resume_with_force, refuse_with_redraw

    out = out.expanduser()
    if redraw:
        refuse_with_redraw()
        run = store.read_run(out)  # said if stopped while the report is drawn:
        STATE.kept[:], STATE.resume = [f"every record in {out} (no report)"], "--redraw again"
        _report(run, out, as_json=as_json, quiet=quiet)
        return
    refuse_resume_with_force(resume, force)
    _refuse_meaningless(inputs, against)
    device = params.device(default_device() if device is None else device, "--device")
    if case_timeout is not None and not isolate:
        raise ValueError("--case-timeout: a kernel in this process (--no-isolate) cannot be "
                         "stopped; leave out --no-isolate")
    case_timeout = DEFAULT_CASE_TIMEOUT if case_timeout is None else case_timeout
    plan = _plan(kernels, suite, device, cases, against, exclude, list_cases, case_timeout,
                 inputs, thresholds_args=(budget, max_output_error, max_state_error,
                                          min_identical, grad))
    if plan is None:
        return
    meta = {"command": " ".join(["kdalab", *sys.argv[1:]]) if sys.argv[1:2] == ["check"]
            else "kdalab check " + " ".join(kernels),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "device_name": _device_name(device), "suite": plan["suite"], "kernels": kernels,
            "against": against, "isolated": isolate, "excluded": plan["exclude"],
            "cases": [c.name for c in plan["cases"]],
            "inputs": None if inputs is None else str(inputs),
            "thresholds": ({"min identical": min_identical} if against else
                           {"budget": f"{_exact(budget)}x the floor",
                            **({"gradients": "judged"} if grad else {}),
                            **({"output": max_output_error} if max_output_error else {}),
                            **({"state": max_state_error} if max_state_error else {})}),
            "complete": False}
    _run(plan, device, out, meta, force=force, resume=resume, isolate=isolate,
         case_timeout=case_timeout, quiet=quiet or as_json)
    STATE.kept[:] = [f"every record in {out} (the report is not drawn)"]  # said if stopped now
    STATE.resume = f"'kdalab check --redraw --out {out}' draws it"
    meta["versions"] = _versions()
    meta["complete"] = True
    store.write_meta(out, meta)
    _report(store.read_run(out), out, as_json=as_json, quiet=quiet)


def _refuse_meaningless(inputs, against) -> None:
    """An option the run would ignore, given beside the one that voids it: a ValueError."""
    from kdalab.cli.stored import given_options
    given = given_options()
    judged = [o for o in ("--budget", "--max-output-error", "--max-state-error", "--grad")
              if o in given]
    for ignored, why in ((inputs is not None and "--suite" in given,
                          "--suite: --inputs grades the captured inputs instead of a suite"),
                         (against is not None and judged, f"{', '.join(judged)}: with --against "
                          "a case is judged by its bit-identical outputs (--min-identical)"),
                         (against is None and "--min-identical" in given,
                          "--min-identical judges the fidelity mode only (--against KERNEL)")):
        if ignored:
            raise ValueError(why)


def _exact(value: float) -> str:
    """A threshold as ``{:g}`` writes it where that is exact, else every digit: the stored
    run's identity must tell two budgets apart (--resume)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _plan(kernels, suite, device, cases, against, exclude, list_cases, case_timeout,
          inputs, thresholds_args) -> dict | None:
    """Every option parsed and checked (usage errors raise ValueError here, before anything
    runs); None when --list was asked for (printed)."""
    from kdalab.check import (
        ConventionError,
        KernelUnavailable,
        Thresholds,
        get_suite,
        load_kernel,
        select_cases,
    )
    from kdalab.check.builtin import KERNEL_HELP
    from kdalab.check.replay import replay_cases

    if suite is None:
        suite = "full" if device.startswith("cuda") else "quick"
    try:
        pool = replay_cases(inputs) if inputs is not None else get_suite(suite)
        selected = select_cases(pool, cases)
        thresholds = Thresholds(*thresholds_args)
    except ValueError as exc:
        raise ValueError(str(exc).replace("max_output_error", "--max-output-error")
                         .replace("max_state_error", "--max-state-error")
                         .replace("min_identical", "--min-identical")
                         .replace("budget must", "--budget must")) from None
    if inputs is not None:
        suite = f"inputs {inputs}"
    if list_cases:
        for case in selected:
            typer.echo(f"{case.name:24s} {case.about}")
        typer.echo(KERNEL_HELP)
        return None
    if not kernels:
        raise ValueError(f"give at least one kernel; {KERNEL_HELP}")
    if len(set(kernels)) != len(kernels):
        raise ValueError(f"a kernel is named twice: {' '.join(kernels)}")
    if against is not None and against in kernels:
        raise ValueError(f"--against {against}: also among the kernels checked")
    loaded = []
    for spec in kernels + ([against] if against is not None else []):
        try:
            kernel = load_kernel(spec)
            kernel.check_available(device)
        except (KernelUnavailable, ConventionError) as exc:
            raise ValueError(str(exc)) from None
        loaded.append(kernel)
    for kernel in loaded[:len(kernels)]:  # refused before anything runs: what it cannot take
        declined = [kernel.declines_case(c) for c in selected]
        if all(declined):
            raise ValueError(f"kernel {kernel.name!r} takes none of the {len(selected)} cases "
                             f"asked ({selected[0].name}: {declined[0]})")
    if not (math.isfinite(case_timeout) and case_timeout >= 0):
        raise ValueError(f"--case-timeout must be a number of seconds >= 0, got {case_timeout}")
    excluded: dict[str, list[str]] = {}
    for item in exclude or []:
        name, sep, patterns = item.partition("=")
        if not sep or name not in kernels:
            raise ValueError(f"--exclude must be KERNEL=PATTERNS with KERNEL one of the "
                             f"kernels checked ({', '.join(kernels)}), got {item!r}")
        try:
            excluded.setdefault(name, []).extend(
                c.name for c in select_cases(selected, patterns))
        except ValueError as exc:
            raise ValueError(str(exc).replace("--cases", f"--exclude {name}")) from None
    return {"suite": suite, "cases": selected, "thresholds": thresholds, "exclude": excluded,
            "kernels": loaded[:len(kernels)],
            "against": loaded[-1] if against is not None else None}


def _open(plan: dict, device: str, out: Path, meta: dict, force: bool, resume: bool):
    """The run's store in ``out`` (refusals: :func:`kdalab.check.records.open_run`) and its
    ``check.json``, written now so that an interrupted run can be redrawn. Resumed, ``meta``
    goes on from the stored run's: its command and date stay, the sessions' seconds add up
    and ``resumed`` lists when it was continued."""
    from kdalab.check import records as store
    from kdalab.check.harness import blank_record

    kernels, against, cases = plan["kernels"], plan["against"], plan["cases"]
    fields = list(blank_record(kernels[0].name, cases[0], device=device,
                               thresholds=plan["thresholds"],
                               against=None if against is None else against.name))
    config = {k: meta[k] for k in ("suite", "kernels", "against", "excluded", "cases",
                                   "inputs", "thresholds")}
    opened = store.open_run(out, kernels=[k.name for k in kernels],
                            cases=[c.name for c in cases], fields=fields,
                            config={**config, "device": device}, force=force, resume=resume)
    before = _stored_meta(out) if resume else {}
    if before:
        meta.update(command=before.get("command", meta["command"]),
                    date=before.get("date", meta["date"]),
                    resumed=[*before.get("resumed", []), meta["date"]])
        for key in ("elapsed_s", "seconds_per_kernel"):
            if key in before:
                meta[key] = before[key]
    store.write_meta(out, meta)
    return opened


def _stored_meta(out: Path) -> dict:
    """The stored run's ``check.json`` (empty if there is none, or it does not read)."""
    from kdalab.check.records import META

    try:
        meta = json.loads((out / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _add_seconds(meta: dict, elapsed: float, timings: dict) -> None:
    """This session's seconds added to the run's (``elapsed_s``, ``seconds_per_kernel``)."""
    meta["elapsed_s"] = round(meta.get("elapsed_s", 0.0) + elapsed, 1)
    per = dict(meta.get("seconds_per_kernel", {}))
    for name, seconds in timings.items():
        per[name] = round(per.get(name, 0.0) + seconds, 1)
    meta["seconds_per_kernel"] = per


def _run(plan: dict, device: str, out: Path, meta: dict, *, force: bool, resume: bool,
         isolate: bool, case_timeout: float, quiet: bool) -> None:
    """The check with progress, records stored in ``out`` as cases finish (resumed: the pairs
    without a record); errors that stop it exit here, every record so far kept (the store
    says the run is interrupted, ``check.json`` the seconds spent)."""
    from kdalab.check import ConventionError, DeviceFault, run_check
    from kdalab.check.isolate import run_isolated
    from kdalab.check.records import LOGS
    from kdalab.cli.progress import WeightedProgress

    kernels, against = plan["kernels"], plan["against"]
    t0, timings = time.perf_counter(), {}
    writer = _open(plan, device, out, meta, force, resume)
    stored, before = writer.stored, writer.count
    common = dict(thresholds=plan["thresholds"], timings=timings, exclude=plan["exclude"],
                  stored=stored)
    total = len(plan["cases"]) * len(kernels)
    again = (f"'kdalab check (the same kernels and options) --out {out} --resume' continues "
             f"with the rest; kdalab check --redraw --out {out} draws the (incomplete) report")
    STATE.kept[:] = [f"{out}/check.json (the run's description), "
                     + (f"{before} of {total} records" if before else "no records yet")]
    STATE.resume = again if before else ""
    if before and not quiet:
        console.print(f"resuming: {before} of {total} records already stored in {out}/",
                      highlight=False)
    try:
        with writer, WeightedProgress("records", total, total, quiet, what="check") as bar:
            bar.start_at(before, before)

            def show(done, _, label):
                bar.update(items=before + done, done=before + done, note=label)

            def sink(records):
                writer.write(records)
                STATE.kept[:] = [f"{writer.count} of {total} records in {out}"]
                STATE.resume = again

            if isolate:
                run_isolated(
                    [k.name for k in kernels], plan["cases"], suite=plan["suite"],
                    device=device, against=None if against is None else against.name,
                    logs=out / LOGS, sink=sink, progress=show,
                    timeout=case_timeout or None, **common)
            else:
                run_check(kernels, plan["cases"], device=device, against=against, sink=sink,
                          progress=show, **common)
    except ConventionError as exc:
        raise ValueError(f"{exc} ({writer.count} records so far are in {out})") from None
    except DeviceFault as exc:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(str(exc))}; {writer.count} records so "
                          f"far are in {out} (--isolate runs each kernel in its own "
                          f"process and records the crash)", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    finally:
        _add_seconds(meta, time.perf_counter() - t0, timings)
        from kdalab.check.records import write_meta

        write_meta(out, meta)


def _report(run: tuple[list[dict], dict], out: Path, *, as_json: bool, quiet: bool) -> None:
    """Views on disk and on the terminal (or JSON); exit code 1 when a case failed or a kernel
    ran no case at all (no pass without a run)."""
    from rich.markup import escape

    from kdalab.check.records import drawing_views
    from kdalab.cli.common import jsonable
    from kdalab.cli.stored import export_json
    from kdalab.views.check import notes, summary, terminal_table, verdict
    from kdalab.views.check_report import write_check_views

    records, meta = run
    with drawing_views(out) as (store, drawn):
        paths = write_check_views(records, meta, out)
        paths.append(export_json(store, out / "records.json"))
        drawn += paths
    passed, line = verdict(records, complete=meta.get("complete", True))
    if as_json:
        doc = {"passed": passed, "meta": meta,
               "summary": summary(records).to_dict("records"), "records": records}
        typer.echo(json.dumps(jsonable(doc), indent=1, default=str, allow_nan=False))
    elif not quiet:
        title = f"kdalab check — {meta.get('suite', '?')} suite on {meta.get('device_name', '?')}"
        console.print(terminal_table(records, title=title))
        for note in notes(records):
            console.print(f"  {note}", highlight=False, markup=False)
        mark = "[bold green]PASS[/]" if passed else "[bold red]FAIL[/]"
        took = f" in {meta['elapsed_s']} s" if "elapsed_s" in meta else ""
        console.print(f"{mark}: {escape(line[6:])}{took}; wrote the report to "
                      f"{out}/ ({', '.join(p.name for p in paths)})", highlight=False,
                      markup=True)
    if not passed:
        raise typer.Exit(code=1)

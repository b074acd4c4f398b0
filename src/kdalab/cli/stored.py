"""A study run into its store from the command line (every study and ``sweep`` /
``reproduce``): a cost-weighted progress bar while the batches run, what was kept said on an
interrupt, then the views drawn once from the stored records; and ``--redraw``, the views drawn
again from a store of the same study."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from kdalab.cli.app import STATE, console, mark
from kdalab.cli.progress import WeightedProgress, drawing

__all__ = ["run_study", "run_into_folder", "redraw_study", "redraw_folder", "draw_views",
           "export_json", "given_options", "refuse_with_redraw",
           "refuse_resume_with_force"]

#: what ``--redraw`` leaves alone: where the records are, and how the views are shown or exported
#: (no option that chooses what is computed or stored)
REDRAW_KEEPS = ("out", "redraw", "quiet", "json", "as_json", "debug")


def given_options(keep: tuple[str, ...] = ()) -> list[str]:
    """The options (and arguments) of the running command that the user gave on the command
    line, as written (``--chunks``, ``CONFIG``), but for the parameters named in ``keep``."""
    ctx = _current_context()
    if ctx is None:
        return []
    given = []
    for param in ctx.command.params:
        if param.name in keep:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given.append(param.opts[0] if param.opts[0].startswith("-")
                         else str(param.name).upper())  # an argument: CONFIG, KERNELS
    return given


def refuse_with_redraw(keep: tuple[str, ...] = REDRAW_KEEPS) -> None:
    """A ValueError naming every option given with ``--redraw`` that would change what is
    computed or stored (``--redraw`` draws from the stored records and runs nothing): one rule
    for every command with a store, instead of options silently ignored."""
    extra = given_options(keep)
    if extra:
        folder = ("; it takes its folder as '--redraw --out PATH'"
                  if any(not e.startswith("-") for e in extra) else "")
        raise ValueError(f"--redraw draws from the stored records: it takes no "
                         f"{', '.join(extra)}{folder}")


def refuse_resume_with_force(resume: bool, force: bool) -> None:
    """``--resume`` keeps what the folder stores and ``--force`` throws it away: together they
    ask for both, a ValueError (every command with a store says it alike)."""
    if resume and force:
        raise ValueError("--resume keeps the records in --out and --force replaces them: "
                         "give one")


@contextmanager
def _said_if_stopped(kept: str, resume: str):
    """What the interrupt boundary says (:data:`kdalab.cli.app.STATE`) if the command stops
    inside the block: every record is stored, the views are not drawn, and how to draw them.
    Taken back when the block completes."""
    STATE.kept.append(kept)
    STATE.resume = resume
    yield
    STATE.kept.pop()
    STATE.resume = ""


def _current_context():
    """click's context of the running command (typer vendors click from 0.26), or None."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # an older typer, on click itself
        from click import get_current_context
    return get_current_context(silent=True)


def run_into_folder(study, out: Path, *, draw: Callable, again: str, resume: bool = False,
                    force: bool = False, backend: str = "local", address: str | None = None,
                    quiet: bool = False, noun: str = "runs",
                    weight: Callable | None = None, total: float | None = None,
                    summary: Callable[[int, float], str] | None = None,
                    records_option: str = "--seeds", runs_option: str = "--seeds",
                    what: str = "sweep") -> tuple[list[Path], int, float]:
    """Run ``study`` (:class:`kdalab.runner.Study`) into the store in ``out`` with progress
    (``weight(batch)``: a batch's estimated cost, ``total`` the study's; by default a cell
    study's costs, else its runs; ``what``: the work, as progress names it), says
    ``summary(runs computed, seconds)`` and draws the views (``draw(store, show)`` -> files:
    :func:`draw_views`). Returns the files written, the runs
    computed and the seconds they took. Interrupted, every finished part is kept and the
    boundary says how to continue (``again``, with ``{out}``). A study too large for this
    machine is refused before the store is made, naming ``runs_option`` when it has too many
    runs and ``records_option`` when one run would make too many records."""
    from kdalab import params

    refuse_resume_with_force(resume, force)
    params.run_count([len(study)], runs_option, noun)  # refused before the store is made
    params.records_per_run(study.records_per_run, records_option, noun=noun.rstrip("s"))
    if weight is None and hasattr(study, "cost"):  # a cell study: its cells' estimated costs
        def weight(batch) -> float:
            return float(sum(study.cost(k) for k in batch.keys))

        total = float(sum(study.cost(k) for k in study.keys()))
    elif weight is None:
        def weight(batch) -> float:
            return float(len(batch.index))

        total = float(len(study))
    t0 = time.perf_counter()
    try:
        paths, ran, elapsed = _run_into_store(study, out, draw, again, resume, force, backend,
                                              address, quiet, noun, weight, total, summary, t0,
                                              what)
    except BaseException:
        if STATE.kept and not (out / "manifest.json").is_file():
            # the store removed what it had begun (nothing was stored): nothing to resume
            STATE.kept.pop()
            STATE.resume = ""
        raise
    return paths, ran, elapsed


def _run_into_store(study, out, draw, again, resume, force, backend, address, quiet, noun,
                    weight, total, summary, t0, what):
    from kdalab.runner import open_store, run_into_store

    with open_store(study, out, resume=resume, force=force) as store:
        mark("store open")
        before = int(store.done.sum())
        if before and not quiet:
            console.print(f"resuming: {before} of {store.runs} {noun} already stored in {out}/",
                          highlight=False)
        try:
            with WeightedProgress(noun, store.runs, total, quiet, what=what) as bar:
                bar.start_at(before, total * before / max(store.runs, 1))

                def advance(batch) -> None:
                    if bar.items == before:
                        mark("first batch stored")
                    bar.advance(len(batch.index), weight(batch))

                ran = run_into_store(study, store, backend=backend, address=address,
                                     progress=advance)
            store.flush()
            mark("every record on disk")
        except BaseException:
            store.close()  # what was computed is on disk before anything is said
            STATE.kept.append(f"{int(store.done.sum())} of {store.runs} {noun} stored in {out}")
            STATE.resume = f"'{again.format(out=out)}' continues with the rest"
            raise
        elapsed = time.perf_counter() - t0
        if summary is not None and not quiet:
            console.print(summary(ran, elapsed), highlight=False)
        with _said_if_stopped(f"all {store.runs} {noun} stored in {out} (the views are not "
                              f"drawn)", f"'{again.format(out=out)}' draws them"):
            paths = draw_views(store, draw, show=not quiet)
        mark("views drawn")
    return paths, ran, elapsed


def run_study(study, out: Path, draw: Callable, *, command: str, resume: bool, force: bool,
              quiet: bool, noun: str = "cells", records_option: str = "--seeds") -> None:
    """A study command (``kdalab run <command>``): ``study`` into its store in ``out`` (made by
    the store, once everything is known to be valid) and its views (``draw``) by
    :func:`run_into_folder`, then said."""
    from kdalab import params

    folder = params.output_folder(out, "--out", create=False)
    paths, _, _ = run_into_folder(
        study, folder, draw=draw, resume=resume, force=force, quiet=quiet, noun=noun,
        records_option=records_option, runs_option="--chunks",  # cells grow with the chunks
        what=command,
        again=f"kdalab run {command} (the same options) --out {{out}} --resume",
        summary=lambda ran, seconds: f"{ran} {noun} × {study.records_per_run} records in "
                                     f"{seconds:.1f} s")
    if not quiet:
        console.print(f"wrote {len(paths)} files to {folder}/", highlight=False)


def redraw_study(out: Path, kind: str, draw: Callable, *, quiet: bool = False,
                 noun: str = "cells") -> None:
    """A study's ``--redraw``: its views drawn again from the store in ``out``, and said."""
    from kdalab import params

    refuse_with_redraw()
    folder = params.user_path(out, "--out")
    paths, stored = redraw_folder(folder, kind, draw, quiet=quiet)
    if not quiet:
        console.print(f"{stored} {noun} → wrote {len(paths)} files to {folder}/",
                      highlight=False)


def redraw_folder(folder: Path, kind: str, draw: Callable, *, option: str = "--redraw",
                  quiet: bool = False) -> tuple[list[Path], int]:
    """Draw the views of the ``kind`` store in ``folder`` again; a folder that holds no store,
    or another study's or tool's, is a ValueError naming ``option``. Returns the files and the
    runs stored."""
    from kdalab.records import StoreError, StoreReader

    try:
        store = StoreReader.read_only(folder, lock=True, kind=kind)
    except StoreError as exc:
        raise ValueError(f"{option}: {exc}") from None
    with store:
        stored = int(store.done.sum())
        if not stored:
            raise ValueError(f"{option}: {folder} holds no stored records yet")
        if not quiet and not store.complete:
            console.print(f"{folder} holds {stored} of {store.runs} runs (--resume completes "
                          "it); drawing from those", highlight=False)
        with _said_if_stopped(f"every record in {folder} (the views are not drawn)",
                              f"{option} again draws them"):
            return draw_views(store, draw, show=not quiet), stored


def draw_views(store, draw: Callable, *, show: bool = True) -> list[Path]:
    """``draw(store, show)`` once from the stored records, the previous drawing's files removed
    first (no stale table survives) and the new ones listed in the manifest."""
    if store.writable:
        store.flush()  # the records on disk before anything is drawn from them
    with drawing(quiet=not show):
        store.remove_views()
        paths = draw(store, show)
        store.set_views(paths)
    return paths


def sweep_views(store, show: bool) -> list[Path]:
    """The inverse experiment's views (:func:`~kdalab.views.sweep_views.draw_sweep_views`):
    the seed's tables (printed when ``show``, and as Markdown and CSV), every aggregate
    (``summary.csv``) and the error plot."""
    from kdalab.cli.common import print_table
    from kdalab.views.sweep_views import draw_sweep_views

    paths, text = draw_sweep_views(store)
    if show:
        for title, columns, rows in text:
            print_table(title, columns, rows)
    return paths


def export_json(store, path: Path) -> Path:
    """Every record as one JSON list in run order, streamed group by group (non-finite floats as
    the strings "inf", "-inf", "nan"); written whole or not at all."""
    import json
    import math

    def encoded(value):
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return value

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("[")
        sep = "\n"
        for _, table in store.iter_groups():
            for rec in table.to_pylist():
                fh.write(sep + json.dumps({k: encoded(v) for k, v in rec.items()},
                                          allow_nan=False))
                sep = ",\n"
        fh.write("\n]\n")
    tmp.replace(path)
    return path

"""``kdalab run inverse-stability``: where each (I + L)⁻¹ algorithm fails over key collinearity ×
β × decay, beside the Neumann product's predicted growth (docs/inverse-stability.md)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import console, prose, run_app

_CONFIG = "inverse-stability-config.json"  # marks a folder as this command's own


# --- the study's records on disk: the one place that knows the store --------------------------

def _store_records(out: Path, records: list[dict]) -> None:
    from kdalab.records.legacy import RecordWriter

    with RecordWriter(out) as writer:
        writer.write(records)


def _load_records(out: Path) -> list[dict]:
    from kdalab.records.legacy import read_records

    return read_records(out)


# ---------------------------------------------------------------------------------------------

def _floats(value: str, name: str, lo: float, hi: float) -> tuple[float, ...]:
    """Comma-separated finite numbers in [lo, hi], duplicates dropped, order kept."""
    out = []
    for item in value.split(","):
        try:
            v = float(item.strip())
        except ValueError:
            raise ValueError(f"{name}: cannot read {item.strip()!r}; expected comma-separated "
                             f"numbers in [{lo:g}, {hi:g}]") from None
        if not (math.isfinite(v) and lo <= v <= hi):
            raise ValueError(f"{name} must hold numbers in [{lo:g}, {hi:g}], got {item.strip()}")
        out.append(v)
    return tuple(dict.fromkeys(out))


def _folder(out: Path, force: bool) -> Path:
    from kdalab import params

    out = params.user_path(out, "--out")
    if out.is_dir() and any(out.iterdir()) and not (out / _CONFIG).exists() and not force:
        raise ValueError(f"--out: {str(out)!r} holds files that are not this study's; choose "
                         "another folder or pass --force")
    return params.output_folder(out, "--out", create=False)  # made once the study has run


@run_app.command(
    "inverse-stability",
    short_help="Where each (I + L)⁻¹ algorithm fails: key collinearity × β × decay.",
    help=prose("""The stability map of the intra-chunk inverse: fp16 and
fp32 Neumann products, FlashKDA v2's 8×8 fp32 substitution with a bf16 merge, fla's 16×16 fp32
substitution and merge, and LAPACK in fp64, on chunks of unit keys around one shared key (spread
s), write strength β and decay g per step. Writes records, a summary table and heatmaps with
the 1e-2 contour (measured and, for the Neumann products, predicted from the growth of L's
powers) to --out."""))
def inverse_stability(
    quick: Annotated[bool, typer.Option(help="A small grid (seconds): C = 16, dim 32")] = False,
    chunks: Annotated[Optional[str], typer.Option(
        help="Chunk sizes, e.g. '16,32,64'", show_default="16,32,64")] = None,
    algorithms: Annotated[Optional[str], typer.Option(
        help="fp16-neumann, fp32-neumann, flashkda-v2, fla, fp64-exact", show_default="all")]
    = None,
    spreads: Annotated[Optional[str], typer.Option(
        help="Key spreads s >= 0 (0: collinear)", show_default="0.001,...,3")] = None,
    betas: Annotated[Optional[str], typer.Option(
        help="Write strengths β in [0, 1]", show_default="0.1,0.3,0.5,0.7,0.9,1")] = None,
    decays: Annotated[Optional[str], typer.Option(
        help="Per-step log-decays g <= 0 (natural log)", show_default="0,-0.01,-0.05,-0.2")]
    = None,
    samples: Annotated[Optional[int], typer.Option(
        help="Draws per grid point (the worst is kept)", show_default="4")] = None,
    dim: Annotated[Optional[int], typer.Option(help="Key dimension", show_default="128")]
    = None,
    seed: Annotated[int, typer.Option(help="Seed of the draws")] = 0,
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/inverse-stability"),
    force: Annotated[bool, typer.Option(help="Write into a folder holding other files")]
    = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="Nothing on the terminal")] = False,
    redraw: Annotated[bool, typer.Option(
        help="Run nothing: draw the table and heatmaps again from the records in --out")]
    = False,
) -> None:
    from dataclasses import replace

    from kdalab import params
    from kdalab.studies.inverse_stability import ALGORITHMS, FULL, QUICK, run_study, summarize

    if redraw:
        given = {"--quick": quick, "--chunks": chunks, "--algorithms": algorithms,
                 "--spreads": spreads, "--betas": betas, "--decays": decays,
                 "--samples": samples, "--dim": dim, "--seed": seed or None, "--force": force}
        extra = [k for k, v in given.items() if v]
        if extra:
            raise ValueError(f"--redraw draws from the records in --out: it takes no "
                             f"{', '.join(extra)}")
        folder = params.user_path(out, "--out")
        try:
            records = _load_records(folder)
        except FileNotFoundError:
            raise ValueError(f"--out: no records in {str(folder)!r} to redraw") from None
        _draw(records, summarize(records), folder, quiet)
        return
    changes = {}
    if chunks is not None:
        changes["chunks"] = params.int_list(chunks, "--chunks", 2)
    if algorithms is not None:
        changes["algorithms"] = params.choices(algorithms, "--algorithms", ALGORITHMS)
    if spreads is not None:
        changes["spreads"] = _floats(spreads, "--spreads", 0.0, 1e6)
    if betas is not None:
        changes["betas"] = _floats(betas, "--betas", 0.0, 1.0)
    if decays is not None:
        changes["decays"] = _floats(decays, "--decays", -50.0, 0.0)
    if samples is not None:
        changes["samples"] = params.integer(samples, "--samples", 1, int64=True)
    if dim is not None:
        changes["dim"] = params.integer(dim, "--dim", 1, int64=True)
    changes["seed"] = params.integer(seed, "--seed", 0, int64=True)
    cfg = replace(QUICK if quick else FULL, **changes)
    folder = _folder(out, force)
    t0 = time.perf_counter()
    records = run_study(cfg)  # (a request too large for memory fails here, before any file)
    folder = params.output_folder(folder, "--out")
    (folder / _CONFIG).write_text(json.dumps(cfg.as_dict(), indent=1) + "\n")
    _store_records(folder, records)
    elapsed = time.perf_counter() - t0
    summary = summarize(records)
    _draw(records, summary, folder, quiet)
    if not quiet:
        console.print(f"{len(records)} records in {elapsed:.1f} s → {folder}/", highlight=False)


def _draw(records, summary, folder: Path, quiet: bool) -> None:
    from kdalab.cli.progress import drawing

    with drawing(quiet=quiet):
        from kdalab.views.inverse_stability import write_inverse_stability_views

        paths = write_inverse_stability_views(records, summary, folder)
    if quiet:
        return
    from rich.table import Table

    table = Table(title="Inverse stability: grid points failing (error ≥ 1e-2 or non-finite)")
    for col in ("C", "algorithm", "points", "failing", "non-finite", "worst finite error",
                "predicted failing"):
        table.add_column(col, justify="right")
    for r in summary:
        table.add_row(str(r["chunk"]), r["algorithm"], str(r["points"]), str(r["failing"]),
                      str(r["nonfinite"]), f"{r['worst_inverse_error']:.2e}",
                      "—" if r["predicted_failing"] is None else str(r["predicted_failing"]))
    console.print(table)
    console.print(f"wrote {len(paths)} files to {folder}/", highlight=False)

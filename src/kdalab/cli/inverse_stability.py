"""``kdalab run inverse-stability``: where each (I + L)⁻¹ algorithm fails over key collinearity ×
β × decay, beside the Neumann product's predicted growth (docs/inverse-stability.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from kdalab.cli.app import console, prose, run_app
from kdalab.cli.options import Force, Quiet, Redraw, Resume

KIND = "inverse-stability"


def _study(cfg):
    """The study as the runner runs it (:class:`kdalab.runner.Study`): one cell per (chunk,
    spread, algorithm), its records one per (β, decay); a batch is the cells of one (chunk,
    spread), which :func:`~kdalab.studies.inverse_stability.run_batch` computes together."""
    from dataclasses import replace

    from kdalab.studies.cells import CellStudy
    from kdalab.studies.inverse_stability import Batch, algorithms_for, run_batch

    class InverseStabilityStudy(CellStudy):
        kind = KIND
        FIELDS = (("chunk", "int"), ("algorithm", "str"), ("spread", "float"),
                  ("beta", "float"), ("decay", "float"), ("samples", "int"), ("dim", "int"),
                  ("seed", "int"), ("inverse_error", "float"),
                  ("inverse_error_median", "float"), ("output_error", "float"),
                  ("nonfinite", "float"), ("l_max", "float"), ("growth", "float"),
                  ("norm_bound", "float"), ("predicted_error", "float"),
                  ("predicted_overflow", "bool"))
        MAX_BATCH = 8  # at least the algorithms of one (chunk, spread): one run_batch
        records_per_run = len(cfg.betas) * len(cfg.decays)

        def keys(self) -> list:
            return [(ci, si, name) for ci, c in enumerate(cfg.chunks)
                    for si in range(len(cfg.spreads))
                    for name in algorithms_for(c, cfg.algorithms)]

        def group(self, key) -> str:  # labels sort as the runs do: records in run order
            return f"chunk{key[0]:03d}-spread{key[1]:03d}"

        def run_cells(self, keys) -> list[list[dict]]:
            ci, si, _ = keys[0]
            names = tuple(k[2] for k in keys)  # the runs already stored are left out
            records = run_batch(replace(cfg, algorithms=names),
                                Batch(cfg.chunks[ci], cfg.spreads[si]))
            return [[r for r in records if r["algorithm"] == name] for name in names]

        def identity(self) -> dict:
            return cfg.as_dict()

    return InverseStabilityStudy()


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


@run_app.command(
    "inverse-stability",
    short_help="Where each (I + L)⁻¹ algorithm fails: key collinearity × β × decay.",
    help=prose("""The stability map of the intra-chunk inverse: fp16 and
fp32 Neumann products, FlashKDA v2's 8×8 fp32 substitution with a bf16 merge, fla's 16×16 fp32
substitution and merge, and LAPACK in fp64, on chunks of unit keys around one shared key (spread
s), write strength β and decay g per step. The records go to a store in --out as each (chunk,
spread) finishes (an interrupted study keeps them and --resume completes it; a folder holding
anything else is refused unless --force); a summary table and heatmaps with the 1e-2 contour
(measured and, for the Neumann products, predicted from the growth of L's powers) are drawn
from them, and again with --redraw."""))
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
    resume: Resume = False,
    force: Force = False,
    quiet: Quiet = False,
    redraw: Redraw = False,
) -> None:
    from dataclasses import replace

    from kdalab import params
    from kdalab.cli.stored import redraw_study, run_study
    from kdalab.studies.inverse_stability import ALGORITHMS, FULL, QUICK

    if redraw:
        return redraw_study(out, KIND, _views, quiet=quiet)
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
    _check_memory(cfg)
    run_study(_study(cfg), out, _views, command="inverse-stability", resume=resume, force=force,
              quiet=quiet)


def _check_memory(cfg) -> None:
    """A ValueError naming --samples or --chunks where a batch (one chunk, every β, decay and
    sample at once) would not fit this machine, before anything runs: about 32 C×C float64
    matrices per grid point and sample (258 bytes per C² measured at C = 192)."""
    from kdalab.studies.plan import check_memory, memory_budget

    points = len(cfg.betas) * len(cfg.decays) * cfg.samples

    def bytes_of(c: int, d: int, m: int) -> int:
        return m * c * (320 * c + 32 * d)

    if bytes_of(2, cfg.dim, 1) > memory_budget("cpu"):  # the keys alone: --dim's doing
        raise ValueError(f"--dim: keys of dimension {cfg.dim:,} do not fit this machine's "
                         "memory even at chunk 2 with one grid point; a smaller --dim")
    if bytes_of(2, cfg.dim, points) > memory_budget("cpu"):  # not even the smallest chunk
        raise ValueError(f"--samples: {points:,} grid points × samples at once (keys of "
                         f"dimension {cfg.dim:,}) do not fit this machine's memory even at "
                         "chunk 2; fewer samples, betas or decays, or a smaller --dim")
    check_memory(cfg.chunks, [cfg.dim], points, "cpu", "--chunks", bytes_of=bytes_of,
                 dim_name="--dim")


def _views(store, show: bool) -> list[Path]:
    from kdalab.studies.inverse_stability import summarize

    records = store.records()
    return _draw(records, summarize(records), store.folder, not show)


def _draw(records, summary, folder: Path, quiet: bool) -> list[Path]:
    from kdalab.views.inverse_stability import write_inverse_stability_views

    paths = write_inverse_stability_views(records, summary, folder)
    if quiet:
        return paths
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
    return paths

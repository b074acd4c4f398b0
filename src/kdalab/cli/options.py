"""What the commands' help lists: the accepted names of every choice, without importing the layers
that define them (which load torch). tests/test_cli.py checks each list against its source, so
they cannot drift: the accumulation registry, the families, the formats, the boundaries. And the
options every command with a store in --out declares alike (``--resume``, ``--force``,
``--redraw``, ``--quiet``)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["ACCUMULATIONS", "GPU_ACCUMULATIONS", "FAMILIES", "E2E_FAMILIES", "FORMATS",
           "BOUNDARIES", "STRATEGIES", "accumulation_help", "Resume", "Force", "Redraw",
           "Quiet"]

#: a study's ``--resume``
Resume = Annotated[bool, typer.Option(
    "--resume", help="Keep what --out already stores of this study and run the rest")]
#: ``--force`` of every command that writes a store
Force = Annotated[bool, typer.Option(
    "--force", help="Replace what --out holds (files that are not this command's store, or "
    "an earlier kdalab's records)")]
#: a study's ``--redraw``
Redraw = Annotated[bool, typer.Option(
    help="Run nothing: draw the views again from the records already in --out")]
#: ``--quiet``
Quiet = Annotated[bool, typer.Option("--quiet", help="No progress or tables on the terminal")]

#: the registry's models that run anywhere, and what each is
ACCUMULATIONS = {
    "fp64": "float64 GEMM (the reference)",
    "fp32": "float32 GEMM as torch runs it",
    "fp16-seq": "fp16 accumulator rounded after every product (the seed's CPU fallback)",
    "fp16-once": "exact sum rounded once to fp16",
    "h200": "the H200's cublasGemmEx COMPUTE_16F, emulated bit for bit (the seed's H200 run)",
    "h200-mma": "chained mma.sync fp16 blocks (FlashKDA's inverse), emulated",
    "h200-bf16-fp32": "chained mma.sync bf16→fp32 blocks, emulated",
    "h200-fp16-fp32": "chained mma.sync fp16→fp32 blocks, emulated",
    "h200-sgemm": "the H200's cuBLAS fp32 GEMM order, emulated",
}
#: the registry's models that need CUDA (each the GPU twin of an h200 model)
GPU_ACCUMULATIONS = ("gpu-h200", "gpu-h200-mma", "gpu-h200-bf16-fp32", "gpu-h200-fp16-fp32",
                     "gpu-h200-sgemm")
FAMILIES = ("floor", "weak_decay_correlated", "model_like")
E2E_FAMILIES = ("model_like", "saturated", "weak_decay_correlated", "long")
FORMATS = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2")
BOUNDARIES = ("start", "midpoint", "end", "per_pair")
STRATEGIES = ("chunk_start", "midpoint", "per_pair", "secondary", "secondary-start",
              "secondary-midpoint")


def accumulation_help(what: str) -> str:
    names = ", ".join(ACCUMULATIONS)
    return (f"{what}: {names}; on a CUDA machine also the GPU's own {', '.join(GPU_ACCUMULATIONS)}"
            " (with --device cuda an h200 model runs as its gpu- twin).")

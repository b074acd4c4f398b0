#!/usr/bin/env python3
"""Where the CUDA sweep's warm-up and its views go (issue 15), each in a fresh process.

    python3 scripts/device/warm_probe.py warm            # CUDA's first work, step by step
    python3 scripts/device/warm_probe.py profile         # the warm-up batch under cProfile
    python3 scripts/device/warm_probe.py profile-cold    # the same with nothing warmed first
    python3 scripts/device/warm_probe.py views FOLDER    # the views of a stored sweep, by step

``warm``: CUDA started on a thread while torch imports (as ``kdalab sweep`` does), then each
library's first use timed on its own: the first tensor, CuPy's import and kdalab's NVRTC
module, a float32 and a float64 GEMM (cuBLAS), a batched ``linalg.inv_ex``, then the sweep's
own warm-up batch and a second one. ``views``: the imports, the store's aggregates, the tables
and the plot, as the views worker draws them.
"""

from __future__ import annotations

import sys
import time

T0 = time.perf_counter()


def step(name: str, t: float) -> float:
    now = time.perf_counter()
    print(f"  {name}: {now - t:.3f} s", flush=True)
    return now


def warm() -> None:
    from kdalab import cudastart

    cudastart.start("cuda")
    import torch

    t = step("import torch (CUDA starting meanwhile)", T0)
    cudastart._THREAD.join()
    t = step("CUDA start's remainder", t)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t = step("first tensor", t)
    import cupy  # noqa: F401

    t = step("import cupy", t)
    from kdalab.arith.gpu import mma

    mma._module().get_function("mma_f16_acc")
    t = step("kdalab's NVRTC module (CuPy's cache)", t)
    a = torch.randn(64, 64, 64, device="cuda")
    (a @ a).sum().item()
    t = step("float32 batched GEMM (cuBLAS start)", t)
    (a.double() @ a.double()).sum().item()
    t = step("float64 batched GEMM", t)
    eye = torch.eye(64, device="cuda", dtype=torch.float64)
    torch.linalg.inv_ex(eye + 0.01 * a.double())[0].sum().item()
    t = step("batched linalg.inv_ex float64", t)
    from kdalab.studies.inverse import launch_group
    from kdalab.inputs.runs import Run

    t = step("kdalab.studies.inverse imported", t)
    for label in ("the sweep's warm-up batch", "the same again"):
        launch_group([Run("floor", -5.0, 16, 0, 16)], ["h200"], device="cuda").table()
        t = step(label, t)


def profile() -> None:
    """The sweep's warm-up batch under cProfile, after the libraries' first uses."""
    import cProfile
    import pstats

    import torch

    from kdalab.arith.gpu import mma
    from kdalab.studies.inverse import launch_group
    from kdalab.inputs.runs import Run

    torch.zeros(1, device="cuda")
    mma._module()
    a = torch.randn(8, 16, 16, device="cuda")
    torch.linalg.inv_ex((a @ a).double())
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    launch_group([Run("floor", -5.0, 16, 0, 16)], ["h200"], device="cuda").table()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def profile_cold() -> None:
    """The command's warm-up from cold (CUDA started on a thread while torch imports, nothing
    else first) under cProfile: every library's first use inside it."""
    import cProfile
    import pstats

    from kdalab import cudastart

    cudastart.start("cuda")
    import torch

    from kdalab.studies.inverse import launch_group
    from kdalab.inputs.runs import Run
    from kdalab.params import accumulations

    models = accumulations(["h200"], "accumulations", "cuda")
    step("imports", T0)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    launch_group([Run("floor", -5.0, 16, 0, 16)], models, device=torch.device("cuda", 0)).table()
    prof.disable()
    step("the warm-up batch from cold", t)
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(45)


def views(folder: str) -> None:
    from kdalab.studies.aggregate import summarize_store
    from kdalab.records import RunStore
    from kdalab.views import plots
    from kdalab.views.tables import seed_tables, write_seed_tables

    plots.FORK_FORMATS = True
    t = step("imports (pandas, pyarrow, matplotlib)", T0)
    for _ in range(2):
        store = RunStore.read_only(folder)
        summary = summarize_store(store)
        t = step("aggregates", t)
        write_seed_tables(seed_tables(summary), store.folder)
        summary.to_csv(store.folder / "summary.csv", index=False)
        t = step("tables and summary.csv", t)
        plots.plot_error_vs_chunk(summary, store.folder)
        t = step("plot (PNG here, SVG in a forked copy)", t)


if __name__ == "__main__":
    {"warm": warm, "profile": profile, "profile-cold": profile_cold, "views": views}[sys.argv[1]](*sys.argv[2:])

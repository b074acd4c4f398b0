"""The backward's gradient accuracy with the GPU's tf32 arithmetic emulated on the CPU.

kdalab's kernels in the Triton interpreter with ``tests/h200_arith.py``'s patches (tf32
products truncate their fp32 operands, as the H100's and H200's do; bf16 stores round to
nearest): ``check --grad``'s quick suite, each gradient's worst error as a multiple of its
floor over the cases, and the ``hunt --grad`` cases kept in ``tests/test_kernels_backward.py``
(the H200's ``HUNT_WORST``: dA_log; ``HUNT_WORST_DBETA``: dβ; one head of the ten-minute H100
hunt's ``HUNT_WORST_DBETA_H100``: dβ), under each variant named (one child process each, side
by side):

    python benchmarks/grad_emulated_cpu.py --json benchmarks/results/grad_emulated_cpu.json
    python benchmarks/grad_emulated_cpu.py --variants "default;prep_block_k=64" --cases model_like
    python benchmarks/grad_emulated_cpu.py --variants "default;kdalab-fp32"

About 3 minutes a variant on one core (the interpreter). A variant is ``[KERNEL:]SETTINGS``:
a kernel ``kdalab check`` loads (default ``kdalab``; e.g. ``kdalab-fp32``, the fp32 path) and
``default`` or ``KEY=INT,...`` of ``kdalab.kernels.autograd.BWD_MODE``'s keys (a kernel alone
means its defaults); the first is the baseline of the ratios. The page's ``round_operands=1``
rows are a deleted candidate's (docs/training.md "Precision")."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    """A variant's kernel and BWD_MODE settings (``default``: none)."""
    from kdalab.check.builtin import BUILTIN
    from kdalab.kernels.autograd import bwd_mode_settings

    kernel, sep, settings = text.rpartition(":")
    if not sep and text in BUILTIN:
        kernel, settings = text, "default"
    kernel = kernel or "kdalab"
    if kernel not in BUILTIN or not kernel.startswith("kdalab"):
        raise ValueError(f"--variants: {kernel!r} is not a kdalab kernel "
                         f"({', '.join(k for k in BUILTIN if k.startswith('kdalab'))})")
    try:
        return kernel, {} if settings == "default" else bwd_mode_settings(settings)
    except ValueError as exc:
        raise ValueError(f"--variants: {exc}") from None


def run_variant(text: str, cases: str | None, hunt: bool) -> dict:
    """One variant in this (child) process: the suite's records' gradient multiples and the
    hunt cases' errors."""
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import h200_arith

    from kdalab.check import Thresholds, get_suite, load_kernel, run_check, select_cases
    from kdalab.kernels import autograd

    kernel, settings = parse_variant(text)
    autograd.BWD_MODE.update(settings)
    suite = get_suite("quick")
    if cases:
        suite = select_cases(suite, cases)
    t0 = time.perf_counter()
    with h200_arith.h200_arithmetic() as counts:
        records = run_check([load_kernel(kernel)], suite, thresholds=Thresholds(grad=True))
        hunts = {}
        if hunt:
            from test_kernels_backward import HUNT_WORST, HUNT_WORST_DBETA, HUNT_WORST_DBETA_H100

            from kdalab.hunt.evaluate import evaluate
            from kdalab.hunt.target import resolve
            from kdalab.inputs.sequences import SequenceSpec

            for name, grad, case in (("HUNT_WORST", "dA_log", HUNT_WORST),
                                     ("HUNT_WORST_DBETA", "dbeta", HUNT_WORST_DBETA),
                                     ("HUNT_WORST_DBETA_H100", "dbeta",
                                      HUNT_WORST_DBETA_H100)):
                rec = evaluate(resolve(kernel, "cpu", grad=True),
                               SequenceSpec(**case["spec"]), case["seed"], grad=True)
                hunts[name] = dict(grad=grad, error=rec[f"{grad}_error"])
    assert counts["tf32_products"][0] > 0  # the emulation was in force
    keep = ["case", "status"] + [f"{g}_{k}" for g in GRADS for k in ("rel_err",
                                                                       "budget_multiple")]
    return dict(variant=text, seconds=time.perf_counter() - t0, hunts=hunts,
                records=[{k: r.get(k) for k in keep} for r in records])


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def rows(results: list[dict]) -> list[dict]:
    """Each variant's cases passed and hunt cases; then, for each variant after the first, a
    row a gradient: its worst multiple of its floor over the suite, with the first variant's
    and the geometric mean of its error over the first's in the note (the first alone: its
    own rows)."""
    base_res = results[0]
    base = {r["case"]: r for r in base_res["records"]}

    def worst(recs, g):
        mult = [r[f"{g}_budget_multiple"] for r in recs.values()
                if _finite(r.get(f"{g}_budget_multiple"))]
        return (max(mult), len(mult)) if mult else (None, 0)

    out = []
    for res in results:
        recs = {r["case"]: r for r in res["records"]}
        fails = [c for c, r in recs.items() if r["status"] != "pass"]
        out.append(dict(target=f"[{res['variant']}] check --grad quick suite: cases passed",
                        value=len(recs) - len(fails), unit="cases",
                        note=f"of {len(recs)}" + (f"; failed: {', '.join(fails)}" if fails
                                                   else "")))
        for name, h in res["hunts"].items():
            out.append(dict(target=f"[{res['variant']}] {name} ({h['grad']})",
                            value=float(f"{h['error']:.4g}"), unit="rel. RMSE"))
    for res in results[1:] or results:
        recs = {r["case"]: r for r in res["records"]}
        for g in GRADS:
            w, n = worst(recs, g)
            if w is None:
                continue
            note = f"over {n} cases"
            if res is not base_res:
                bw, _ = worst(base, g)
                ratios = [recs[c][f"{g}_rel_err"] / base[c][f"{g}_rel_err"] for c in recs
                          if c in base and _finite(recs[c].get(f"{g}_rel_err"))
                          and _finite(base[c].get(f"{g}_rel_err"))
                          and base[c][f"{g}_rel_err"] > 0 and recs[c][f"{g}_rel_err"] > 0]
                note += f"; [{base_res['variant']}] {bw:.3g}x"
                if ratios:
                    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
                    note += (f"; its error over [{base_res['variant']}]'s: geometric mean "
                             f"{geo:.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
            out.append(dict(target=f"[{res['variant']}] {g}: worst multiple of its floor",
                            value=round(w, 3), unit="x", note=note))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="default",
                    help="';'-separated BWD_MODE variants (default: %(default)s)")
    ap.add_argument("--cases", default=None, help="some of the quick suite's cases (--cases "
                                                  "patterns of kdalab check)")
    ap.add_argument("--no-hunt", action="store_true", help="leave out the two hunt cases")
    ap.add_argument("--json", default=None, help="the results file (report.py's schema)")
    a = ap.parse_args(argv)
    variants = a.variants.split(";")
    os.environ["TRITON_INTERPRET"] = "1"  # before kdalab.kernels is imported (the check below)
    try:
        for v in variants:
            parse_variant(v)
    except ValueError as exc:
        ap.error(str(exc))
    with ProcessPoolExecutor(max_workers=min(len(variants), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(run_variant, v, a.cases, not a.no_hunt) for v in variants]
        try:
            results = [f.result() for f in futures]
        except ValueError as exc:
            ap.error(str(exc))
    out = rows(results)
    for r in out:
        print(f"{r['target']}: {r['value']} {r['unit']}" + (f" ({r['note']})" if "note" in r
                                                             else ""))
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip()
        import torch
        import triton

        doc = dict(benchmark=Path(a.json).stem,
                   device=f"{platform.processor() or platform.machine()}, torch "
                          f"{torch.__version__}, the Triton {triton.__version__} interpreter "
                          "with tests/h200_arith.py",
                   date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), commit=commit,
                   command="python benchmarks/grad_emulated_cpu.py " + " ".join(
                       sys.argv[1:] if argv is None else argv),
                   rows=out)
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

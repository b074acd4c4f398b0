#!/usr/bin/env python3
"""Rows of ``benchmarks/results/candidates_h200.json`` from two kinds of raw candidate runs that
``collect_h200.py`` does not read: a fused-pass prototype's A/B (``--fused``: the JSON of
``proto_fused.py``, in git at 0297dd8) and the reverse pass's product types
(``--train-variants``: the raw JSON of ``bench_train.py --variants``). A row of the same
target replaces the page's; the page's other rows stay, and its commit and command name
every run behind it.

    python benchmarks/collect_candidates.py --commit 0297dd8 --device "NVIDIA H200" \\
        --date 2026-12-06T22:05Z \\
        --fused benchmarks/results/raw/logs/proto_fused_0297dd8_h200.json \\
        --train-variants benchmarks/results/raw/logs/train_variants_0297dd8_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from collect_h200 import _write  # benchmarks/, beside this script
from train_rows import worst_grad

FUSED = ("candidate {commit}: stage 1 inside stage 2's serial pass (one launch), its best tile's "
         "time over the two stages', CUDA-graph replay (fastest shape)")
VARIANTS = ("candidate {commit}: the reverse pass's products with 16-bit S or dS operands "
            "(autograd.BWD_PRODUCTS), training step over fp32's (tf32) at {shape} (fastest)")


def fused_row(raw: dict, commit: str) -> dict:
    """The fastest shape's best tile over the two stages; every shape's in the note."""
    parts, best = [], []
    equal = True
    for r in raw["rows"]:
        tiles = {k[:-len("_over_two_stage")]: v for k, v in r.items()
                 if k.endswith("_over_two_stage")}
        name, ratio = min(tiles.items(), key=lambda kv: kv[1])
        best.append(ratio)
        equal &= all(r[f"{t}_equal"] == 1.0 and r[f"{t}_flags"] == 0 for t in tiles)
        parts.append(f"{r['shape']} {r[name]:.3f} against {r['two_stage']:.3f} ms "
                     f"({ratio:.2f}x, {name[len('fused_'):]}; slowest tile "
                     f"{max(tiles.values()):.2f}x)")
    note = "; ".join(parts) + ("; every tile's outputs equal the two stages' bit for bit"
                               if equal else "; outputs differ from the two stages'")
    return dict(target=FUSED.format(commit=commit), value=round(min(best), 3), unit="x",
                note=note)


def variants_row(raw: dict, commit: str) -> dict:
    """The step time of each product-type variant over the fp32 one's at one shape, and each
    variant's worst gradient error a family (relative RMS against fp64)."""
    speed = {r["variant"]: r for r in raw["variants"] if "kdalab_ms" in r}
    acc = [r for r in raw["variants"] if "family" in r]
    base = speed["s_fp32_ds_fp32"]["kdalab_ms"]
    shape = speed["s_fp32_ds_fp32"]["shape"]
    parts = []
    for name, r in speed.items():
        worst = []
        for a in (a for a in acc if a["variant"] == name):
            grad = worst_grad(a)
            worst.append(f"{a['family']} {grad} {a[f'kdalab_{grad}']:.2g}" if grad
                         else f"{a['family']} {a.get('kdalab_error', 'no gradients')}")
        parts.append(f"{name} {r['kdalab_ms']:.3f} ms ({r['kdalab_ms'] / base:.3f}x; "
                     + ", ".join(worst) + ")")
    ratios = [r["kdalab_ms"] / base for n, r in speed.items() if n != "s_fp32_ds_fp32"]
    return dict(target=VARIANTS.format(commit=commit, shape=shape), value=round(min(ratios), 3),
                unit="x", note="eager step time (interleaved rounds) and worst gradient error "
                "by family: " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", required=True, help="the commit the raw runs measured")
    ap.add_argument("--fused", type=Path)
    ap.add_argument("--train-variants", type=Path)
    ap.add_argument("--device", required=True,
                    help="the card the raw runs ran on, where a raw file does not name it")
    ap.add_argument("--date", required=True, help="when the raw runs ran (UTC)")
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args()
    for p in (a.fused, a.train_variants):
        if p is not None and not p.is_file():
            print(f"collect_candidates: {p} does not exist", file=sys.stderr)
            sys.exit(2)
    new, raws = [], []
    if a.fused:
        raw = json.loads(a.fused.read_text(encoding="utf-8"))
        new.append(fused_row(raw, a.commit))
        card = raw.get("device", a.device)
        raws.append(f"python benchmarks/proto_fused.py (in git at commit {a.commit}) --rounds 3 "
                    f"({card}; raw {a.fused.name})")
    if a.train_variants:
        raw = json.loads(a.train_variants.read_text(encoding="utf-8"))
        new.append(variants_row(raw, a.commit))
        card = raw.get("device", a.device)
        raws.append(f"python benchmarks/bench_train.py --no-speed --variants "
                    f"{raw['variants'][0]['shape']} --rounds 2 ({card}; raw "
                    f"{a.train_variants.name})")
    path = a.results / "candidates_h200.json"
    page = json.loads(path.read_text(encoding="utf-8"))
    targets = {r["target"] for r in new}
    kept = [r for r in page["rows"] if r["target"] not in targets]
    commits = [a.commit] + [c for c in page["commit"].split(", ") if c != a.commit]
    page.update(commit=", ".join(commits), rows=new + kept, date=a.date,
                command=f"at {a.commit}: " + "; ".join(raws) + " (benchmarks/collect_candidates"
                ".py); " + page["command"].split(" (benchmarks/collect_candidates.py); ")[-1])
    _write(a.results, "candidates_h200", page)


if __name__ == "__main__":
    main()

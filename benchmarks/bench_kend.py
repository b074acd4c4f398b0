#!/usr/bin/env python3
"""KEND's storage, fp32 (the default) against fp16, timed in one process with interleaved
rounds at the issue-11 grid's shapes, plus FlashKDA at each shape as the peer it is compared
with (docs/kernels.md, "Precision path"). fp32 KEND is what keeps the fp16 guard's tf32 redo
accurate on near-collinear keys (chunk_prepare.KEND_DTYPE); this measures what it costs.

    source scripts/device/peers.sh && python3 benchmarks/bench_kend.py --json $OUT/kend.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_kernel as bk  # noqa: E402

import kdalab.kernels.chunk_prepare as prep  # noqa: E402

VARIANTS = {"fp32": torch.float32, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(s[0] for s in bk.GRID))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    flashkda = bk.load_flashkda()
    rows = []
    for name in a.shapes.split(","):
        x = bk.make_inputs(bk.SHAPES[name])
        times = {v: [] for v in VARIANTS} | ({"flashkda": []} if flashkda else {})
        for _ in range(a.rounds):
            for v, dtype in VARIANTS.items():
                prep.KEND_DTYPE = dtype
                times[v].append(bk.bench(lambda: bk.run_kdalab(x)))
            prep.KEND_DTYPE = torch.float32
            if flashkda:
                times["flashkda"].append(bk.bench(lambda: flashkda(x)))
        med = {k: statistics.median(t) for k, t in times.items()}
        line = {"shape": name, **{f"{k}_ms": round(m, 4) for k, m in med.items()},
                "fp32_over_fp16": round(med["fp32"] / med["fp16"], 4)}
        if flashkda:
            line["flashkda_over_fp32"] = round(med["flashkda"] / med["fp32"], 3)
            line["flashkda_over_fp16"] = round(med["flashkda"] / med["fp16"], 3)
        print(json.dumps(line), flush=True)
        rows.append({"target": f"{name}: time with fp32 KEND over fp16 KEND", "unit": "x",
                     "value": line["fp32_over_fp16"],
                     "note": f"{med['fp32']:.3f} against {med['fp16']:.3f} ms"
                     + (f"; FlashKDA / kdalab {line['flashkda_over_fp32']}x (fp16 KEND "
                        f"{line['flashkda_over_fp16']}x)" if flashkda else "")})
    ratios = [r["value"] for r in rows]
    geo = statistics.geometric_mean(ratios)
    print(f"RESULT fp32 KEND over fp16 KEND: geometric mean {geo:.4f}x over {len(ratios)} shapes")
    rows.append({"target": "geometric mean, fp32 KEND over fp16 KEND", "value": round(geo, 4),
                 "unit": "x"})
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        doc = {"benchmark": "kend_storage", "device": torch.cuda.get_device_name(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
               "commit": commit, "command": "python3 benchmarks/bench_kend.py", "rows": rows}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

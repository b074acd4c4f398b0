#!/usr/bin/env python3
"""benchmarks/results/check_h200.json and hunt_h200.json from the folders that
``benchmarks/h200.sh`` brings back (unpacked from ``$OUT/h200.tar.gz``): the check run's
check.json and records.json, each hunt's hunt.json and worst.json. The figures are read from
those files, never typed in.

    python benchmarks/collect_h200.py RUNS --device "NVIDIA H200 (nvidia-h200), ..." \\
        --commit abc1234 [--check] [--hunt]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _write(name: str, doc: dict) -> None:
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def check_rows(folder: Path) -> tuple[dict, list[dict]]:
    run = json.loads((folder / "check.json").read_text(encoding="utf-8"))
    records = json.loads((folder / "records.json").read_text(encoding="utf-8"))
    rows = []
    for kernel in run["kernels"]:
        mine = [r for r in records if r["kernel"] == kernel]
        ran = [r for r in mine if r["status"] in ("pass", "fail")]
        failed = [r for r in ran if r["status"] == "fail"]
        total = len(run["cases"])
        rows.append({"target": f"{kernel}: cases passed ({len(ran)} of {total} ran)",
                     "value": len(ran) - len(failed), "unit": "cases",
                     "note": ("failed: " + ", ".join(r["case"] for r in failed)) if failed
                     else "none failed"})
        acc = [r for r in ran if r["kind"] == "accuracy" and r["o_rel_err"] is not None]
        if acc:
            worst = max(acc, key=lambda r: r["o_rel_err"])
            rows.append({"target": f"{kernel}: worst output error, accuracy cases",
                         "value": float(f"{worst['o_rel_err']:.3g}"), "unit": "rel. RMSE",
                         "note": f"{worst['case']}; floor {worst['bf16_floor']:.3g}"})
        mult = [r["floor_multiple"] for r in acc if r.get("floor_multiple") is not None]
        if mult:
            rows.append({"target": f"{kernel}: worst output error as a multiple of the floor",
                         "value": float(f"{max(mult):.3g}"), "unit": "x",
                         "note": f"median {statistics.median(mult):.3g}x"})
        coll = [r for r in acc if r["case"].startswith("collinear/")]
        if coll and max(coll, key=lambda r: r["o_rel_err"]) is not max(
                acc, key=lambda r: r["o_rel_err"]):  # else the row above says it
            worst = max(coll, key=lambda r: r["o_rel_err"])
            rows.append({"target": f"{kernel}: worst output error, collinear group",
                         "value": float(f"{worst['o_rel_err']:.3g}"), "unit": "rel. RMSE",
                         "note": f"{worst['case']}; " + ("pass" if all(
                             r["status"] == "pass" for r in coll) else "fails")})
        contracts = [r for r in ran if r["kind"] != "accuracy"]
        if contracts:
            broken = [r for r in contracts if r["status"] == "fail"]
            causal = [r["contract_max_diff"] for r in contracts
                      if r["case"].startswith("contract/causal")
                      and r.get("contract_max_diff") is not None]
            rows.append({"target": f"{kernel}: contracts passed ({len(contracts)} ran)",
                         "value": len(contracts) - len(broken), "unit": "contracts",
                         "note": "; ".join([f"{r['case']}: {r['message']}" for r in broken]
                                           + ([f"causal: largest change before the split "
                                               f"{max(causal):.3g}"] if causal else []))})
    return run, rows


def hunt_rows(folders: list[Path]) -> list[dict]:
    rows = []
    for folder in folders:
        meta = json.loads((folder / "hunt.json").read_text(encoding="utf-8"))
        worst = json.loads((folder / "worst.json").read_text(encoding="utf-8"))
        s = worst["spec"]
        rows.append({
            "target": f"hunt {meta['target']}: worst output error in {meta['elapsed_s']:.0f} s "
                      f"({meta['trials_run']} trials)",
            "value": float(f"{worst['output_error']:.3g}"), "unit": "rel. RMSE",
            "note": f"state {worst['state_error']:.2g}; "
                    + ("above" if worst["exceeds_threshold"] else "below")
                    + f" {worst['threshold']:g}; T {s.get('T')}, H {s.get('heads')}, "
                      f"K {s.get('K')}; params " + ", ".join(
                          f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in sorted(worst["params"].items()))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--hunt", action="store_true")
    a = ap.parse_args()
    if a.check:
        run, rows = check_rows(a.runs / "check")
        _write("check_h200", {
            "benchmark": "check_h200", "device": a.device,
            "date": run["date"].replace(" ", "T") + "Z", "commit": a.commit,
            "command": run["command"] + " (benchmarks/h200.sh check"
            + ("" if run.get("complete") else "; INCOMPLETE") + ")", "rows": rows})
    if a.hunt:
        folders = sorted(p for p in a.runs.glob("hunt-*") if (p / "worst.json").exists())
        metas = [json.loads((p / "hunt.json").read_text(encoding="utf-8")) for p in folders]
        dates = [m["date"] for m in metas if "date" in m]
        _write("hunt_h200", {
            "benchmark": "hunt_h200", "device": a.device,
            "date": max(dates) if dates else "", "commit": a.commit,
            "command": "kdalab hunt TARGET --device cuda --seed 0 (benchmarks/h200.sh hunt, "
                       "hunts; kdalab --dims 64,128, two calls with --resume; fla pinned to "
                       "T = 1024, H = 4, K = 128; FlashKDA K = 128)",
            "rows": hunt_rows(folders)})


if __name__ == "__main__":
    main()

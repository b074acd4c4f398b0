#!/usr/bin/env python3
"""benchmarks/results/*_h200.json from the folders that ``benchmarks/h200.sh`` brings back
(each step's ``$OUT/<step>.tar.gz``, unpacked into RUNS): the check run's check.json and
records.json (``--check``), each hunt's hunt.json and worst.json (``--hunt``, the folders
RUNS/hunt-*), the grid's grid.json (``--grid``: kernel_grid.json), bench_decode's decode.json
(``--serving``: serving_prefill_h200.json) and the start-up A/B's sweep_ab_h200.json
(``--sweep``). The figures are read from those files, never typed in.

    python benchmarks/collect_h200.py RUNS --device "NVIDIA H200 (nvidia-h200), ..." \\
        --commit abc1234 [--check] [--hunt] [--grid] [--serving] [--sweep]
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


def grid_doc(path: Path) -> dict:
    """kernel_grid.json from bench_kernel.py --grid's JSON: each shape's best peer over kdalab
    (every time in the note), the geometric mean."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    info = doc["info"]
    rows = []
    for r in doc["grid"]:
        times = ", ".join(f"{p} {r[f'{p}_ms']:.3f} ms" for p in ("kdalab", "fla", "flashkda")
                          if f"{p}_ms" in r)
        rows.append({"target": f"{r['shape']}: best peer / kdalab", "value": round(r["ratio"], 3),
                     "unit": "x", "note": times})
    slowest = min(doc["grid"], key=lambda r: r["ratio"])
    rows.append({"target": f"geometric mean over the grid ({len(doc['grid'])} shapes)",
                 "value": round(doc["geomean"], 3), "unit": "x",
                 "note": f"slowest {slowest['shape']} {slowest['ratio']:.3f}x"})
    return {"benchmark": "kernel_grid", "date": info["date"].replace(" UTC", "Z").replace(
        " ", "T"), "command": "python benchmarks/bench_kernel.py --warm-peers && python "
        "benchmarks/bench_kernel.py --grid (benchmarks/h200.sh grid; peers in the same "
        "process)", "rows": rows}


#: bench_decode.py's rows kept for the page: the pool and checkpoint overheads, the peers,
#: and the candidates still in the code (the pruned ones' figures are in docs/kernels.md; the
#: copy bandwidth is decode_h200's; value blocks of 128 on 8 warps measured 1.00x)
SERVING_KEEP = ("pool_over_plain", "ck64_over_plain", "ck64_bf16_over_plain", "kdalab vs",
                "[kend_single] speed-up", "[guard_launch] speed-up",
                "[guard_inline] speed-up")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--hunt", action="store_true")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--serving", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    a = ap.parse_args()
    if a.grid:
        _write("kernel_grid", {**grid_doc(a.runs / "grid" / "grid.json"), "device": a.device,
                               "commit": a.commit})
    if a.serving:
        doc = json.loads((a.runs / "serving" / "decode.json").read_text(encoding="utf-8"))
        rows = [r for r in doc["rows"] if any(k in r["target"] for k in SERVING_KEEP)]
        _write("serving_prefill_h200", {
            "benchmark": "serving_prefill_h200", "device": a.device, "date": doc["date"],
            "commit": a.commit, "command": doc["command"].replace("/root/out/", "$OUT/"),
            "rows": rows})
    if a.sweep:
        doc = json.loads((a.runs / "sweep" / "sweep_ab_h200.json").read_text(encoding="utf-8"))
        _write("sweep_command_h200", {
            **doc, "benchmark": "sweep_command_h200", "device": a.device, "commit": a.commit,
            "command": doc["command"].replace("/tmp/kd/sweep/", "$OUT/")
            + " (benchmarks/h200.sh sweep)"})
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

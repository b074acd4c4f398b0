#!/usr/bin/env python3
"""benchmarks/results/*_h200.json from the folders that ``benchmarks/h200.sh`` brings back
(each step's ``$OUT/<step>.tar.gz``, unpacked into RUNS): the check run's check.json and
records.json (``--check``), each hunt's hunt.json and worst.json (``--hunt``, the folders
RUNS/hunt-*), the grid's grid.json (``--grid``: kernel_grid.json), bench_decode's decode.json
(``--serving``: serving_prefill_h200.json; ``--decode``: its decode part, decode_h200.json)
and the start-up A/B's sweep_ab_h200.json
(``--sweep``). The figures are read from those files, never typed in.

    python benchmarks/collect_h200.py RUNS --device "NVIDIA H200 (nvidia-h200), ..." \\
        --commit abc1234 [--check] [--hunt] [--grid] [--serving] [--decode] [--sweep]

then ``python benchmarks/report.py`` for the page. ``--results DIR``: read and write the result
files there instead of benchmarks/results (tests/test_benchmarks_report.py runs it so).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

from junit_outcomes import outcomes  # benchmarks/, beside this script

RESULTS = Path(__file__).resolve().parent / "results"


def kept_rows(before: dict, keep) -> list[dict]:
    """The rows of a page file ``before`` that ``keep`` selects, each note ending with the commit
    and date they were measured at (once: a note that names a commit already keeps its own)."""
    tag = f" (commit {before['commit']}, {before['date']})"
    return [dict(r, note=r.get("note", "") + ("" if "(commit " in r.get("note", "") else tag))
            for r in before["rows"] if keep(r)]


def _write(results: Path, name: str, doc: dict) -> None:
    path = results / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


#: groups of the suite with a row of their own: the gate modes of issue 41
GROUPS = {"gate modes": ("unbounded/", "strong_decay/", "log_decay/")}


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
        for group, prefixes in GROUPS.items():
            mine_g = [r for r in acc if r["case"].startswith(prefixes)]
            if mine_g:
                worst = max(mine_g, key=lambda r: r["floor_multiple"] or 0.0)
                rows.append({
                    "target": f"{kernel}: worst output error, {group} group",
                    "value": float(f"{worst['o_rel_err']:.3g}"), "unit": "rel. RMSE",
                    "note": f"{worst['case']}, {worst['floor_multiple']:.3g}x its floor; "
                            f"{len(mine_g)} cases, " + ("all pass" if all(
                                r["status"] == "pass" for r in mine_g) else "some fail")})
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
    # issue 41's "<= fla's on every family": kdalab's output error against fla's, case by case
    errs = {(r["kernel"], r["case"]): max(r["o_rel_err"], r.get("state_rel_err") or 0.0)
            for r in records if r["status"] in ("pass", "fail") and r["kind"] == "accuracy"
            and r["o_rel_err"] is not None}
    for group, prefixes in GROUPS.items():
        both = sorted(c for (k, c) in errs if k == "kdalab" and c.startswith(prefixes)
                      and ("fla", c) in errs)
        if both:
            below = [c for c in both if errs[("kdalab", c)] <= errs[("fla", c)]]
            ratio = max(errs[("kdalab", c)] / errs[("fla", c)] for c in both)
            rows.append({"target": f"kdalab against fla: {group} group, cases at or below "
                                   f"fla's error ({len(both)} cases)",
                         "value": len(below), "unit": "cases",
                         "note": f"the larger of output and state error; kdalab/fla at most "
                                 f"{ratio:.3g}" + ("" if len(below) == len(both) else
                                 "; above: " + ", ".join(sorted(set(both) - set(below))))})
    return run, rows


#: the gradients check --grad judges, in its table's order
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")


def check_grad_rows(folder: Path) -> tuple[dict, list[dict]]:
    """A check --grad run's rows per kernel: the cases passed (with the records' statuses),
    the worst gradient as a multiple of its floor (each gradient's worst beside it) and, where
    the run has them, the collinear cases' dv, dβ and dA_log."""
    run = json.loads((folder / "check.json").read_text(encoding="utf-8"))
    records = json.loads((folder / "records.json").read_text(encoding="utf-8"))
    total, rows = len(run["cases"]), []
    for kernel in run["kernels"]:
        mine = [r for r in records if r["kernel"] == kernel]
        counts = statistics.Counter(r["status"] for r in mine)
        failed = [r["case"] for r in mine if r["status"] == "fail"]
        rows.append({"target": f"check --grad {kernel}: cases passed ({total} in the suite)",
                     "value": counts["pass"], "unit": "cases",
                     "note": f"{len(mine)} records of {total}; " + ", ".join(
                         f"{k} {v}" + (f" ({', '.join(failed[:6])}"
                                       f"{'...' if len(failed) > 6 else ''})"
                                       if k == "fail" else "")
                         for k, v in sorted(counts.items()))})
        bits = [r for r in mine if r.get("kind") in ("causal", "layout")
                and r.get("grad_contract_max_diff") is not None]
        if bits:  # the gradient contracts judged to the bit (kdalab.check.contracts)
            changed = [r["case"] for r in bits if r["grad_contract_max_diff"] != 0]
            rows.append({"target": f"check --grad {kernel}: the gradients' largest change in "
                                   "the bit-level contracts (causal, layout)",
                         "value": max(r["grad_contract_max_diff"] for r in bits), "unit": "abs",
                         "note": f"{len(bits)} cases: {', '.join(r['case'] for r in bits)}; "
                                 + (f"changed in {', '.join(changed)}" if changed
                                    else "every bit kept")})
        graded = [r for r in mine if r.get("dq_budget_multiple") is not None]
        if not graded:
            continue
        worst = {g: max((r for r in graded if r.get(f"{g}_budget_multiple") is not None),
                        key=lambda r, g=g: r[f"{g}_budget_multiple"], default=None)
                 for g in GRADS}
        worst = {g: r for g, r in worst.items() if r is not None}
        top = max(worst, key=lambda g: worst[g][f"{g}_budget_multiple"])
        r = worst[top]
        rows.append({"target": f"check --grad {kernel}: worst gradient as a multiple of its "
                               "floor", "value": float(f"{r[f'{top}_budget_multiple']:.3g}"),
                     "unit": "x",
                     "note": f"{top} on {r['case']}: rel. RMSE {r[f'{top}_rel_err']:.3g}; "
                             f"{len(graded)} cases; per gradient: " + ", ".join(
                                 f"{g} {worst[g][f'{g}_budget_multiple']:.3g}x" for g in worst)})
        coll = [r for r in graded if "collinear" in r["case"]]
        if coll:
            def multiples(r):
                return ", ".join(f"{g} {r[f'{g}_budget_multiple']:.2g}x"
                                 for g in ("dv", "dbeta", "dA_log")
                                 if r.get(f"{g}_budget_multiple") is not None)
            top = max(r[f"{g}_budget_multiple"] for r in coll for g in GRADS
                      if r.get(f"{g}_budget_multiple") is not None)
            rows.append({"target": f"check --grad {kernel}: collinear cases, worst gradient "
                                   "multiple", "value": float(f"{top:.3g}"), "unit": "x",
                         "note": "; ".join(f"{r['case']} {multiples(r)}" for r in coll)})
    return run, rows


def hunt_rows(folders: list[Path]) -> list[dict]:
    """A row a hunt folder: its worst output error, or for a ``hunt --grad`` (hunt.json's
    ``grad``) its worst gradient error, that gradient's multiple of its floor and the first
    trial above the threshold. A folder named ``hunt-NAME@VARIANT`` is a candidate's hunt (e.g.
    h200.sh's HUNT_BWD): VARIANT goes into the row's name."""
    rows = []
    for folder in folders:
        meta = json.loads((folder / "hunt.json").read_text(encoding="utf-8"))
        worst = json.loads((folder / "worst.json").read_text(encoding="utf-8"))
        s = worst["spec"]
        grad = bool(meta.get("grad"))
        variant = folder.name.partition("@")[2]
        name = (f"hunt {meta['target']}" + (" --grad" if grad else "")
                + (f" [{variant}]" if variant else ""))
        what = "gradient" if grad else "output"
        where = (f"T {s.get('T')}, H {s.get('heads')}, K {s.get('K')}; params " + ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in sorted(worst["params"].items())))
        side = ("above" if worst["exceeds_threshold"] else "below") + f" {worst['threshold']:g}"
        if grad:
            first = None
            trials = folder / "trials.jsonl"
            if trials.exists():
                first = next((r for r in _json_lines(trials) if r.get("status") == "measured"
                              and (r.get("grad_error") or 0) > worst["threshold"]), None)
            note = (f"{worst['worst_grad']} at {worst['grad_floor_multiple']:.3g}x its floor; "
                    f"output {worst['output_error']:.2g}; {side}"
                    + (f" (first at trial {first['trial']}, {first['grad_error']:.3g})"
                       if first else "") + f"; {where}")
        else:
            note = f"state {worst['state_error']:.2g}; {side}; {where}"
        rows.append({
            "target": f"{name}: worst {what} error in {meta['elapsed_s']:.0f} s "
                      f"({meta['trials_run']} trials)",
            "value": float(f"{worst['grad_error' if grad else 'output_error']:.3g}"),
            "unit": "rel. RMSE", "note": note})
    return rows


def _json_lines(path: Path) -> list[dict]:
    """The JSON objects a benchmark printed one a line (other lines skipped)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("{")]


def _grid_json(path: Path) -> dict:
    """A grid run's JSON; from its log (``grid.log`` beside it: the rows printed as they were
    timed) when the time limit stopped it before the JSON was written."""
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    lines = _json_lines(path.parent / "grid.log")
    infos = [r for r in lines if "device" in r]
    return {"info": infos[-1], "grid": [r for r in lines if "kdalab_ms" in r], "cut_off": True}


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values))


def alt_doc(paths: list[Path]) -> dict:
    """kernel_candidates_h200.json from grid runs with ``--alt`` (one candidate KernelConfig
    each): a row a candidate, the geometric mean over the shapes of the default's time over
    the candidate's (above 1: the candidate faster), every shape's in the note."""
    rows, dates = [], []
    for path in paths:
        doc = _grid_json(path)
        grid = [r for r in doc["grid"] if "alt_over_default" in r]
        geo = _geomean([r["alt_over_default"] for r in grid])
        per = ", ".join(f"{r['shape']} {r['kdalab_ms']:.3f} -> {r['kdalab_alt_ms']:.3f} ms "
                        f"({r['alt_over_default']:.3f}x)" for r in grid)
        rows.append({"target": f"candidate {doc['alt']}: the default's time over its "
                               f"(geometric mean, {len(grid)} shapes)", "value": round(geo, 3),
                     "unit": "x", "note": per})
        dates.append(doc["info"]["date"].replace(" UTC", "Z").replace(" ", "T"))
    return {"benchmark": "kernel_candidates_h200", "date": max(dates),
            "command": "benchmarks/h200.sh grid with GRID_ALT=<candidate> (bench_kernel.py "
                       "--grid --alt; the default and the candidate timed in the same run)",
            "rows": rows}


def baseline_doc(runs: list[tuple[str, Path]]) -> dict:
    """A candidates page from ``bench_kernel.py --grid --baseline`` runs whose baseline is a
    candidate's kernels (``scripts/baseline_kernels.sh BRANCH``) and whose tree is the commit
    it would join: a row a candidate, the geometric mean over the shapes of its time over the
    tree's (below 1: the candidate faster), eager and, where timed (``--baseline-graph``),
    under CUDA-graph replay; every shape's medians and the outputs' largest difference in the
    note. A LABEL that starts ``tree:`` names a run the other way round: the candidate was
    the tree, the baseline the commit it would join."""
    rows, dates = [], []
    for label, path in runs:
        doc = json.loads(path.read_text(encoding="utf-8"))
        grid = [r for r in doc["grid"] if "kdalab_over_baseline" in r]
        inverted = label.startswith("tree:")
        cand, base = ("kdalab", "baseline") if inverted else ("baseline", "kdalab")
        for form, what in (("", "eager"), ("_graph", "CUDA-graph replay")):
            have = [r for r in grid if f"kdalab_over_baseline{form}" in r]
            if not have:
                continue
            ratio = {r["shape"]: r[f"kdalab_over_baseline{form}"] ** (1 if inverted else -1)
                     for r in have}
            geo = _geomean(list(ratio.values()))
            med = lambda r, who: statistics.median(r[f"{who}{form}_rounds_ms"])  # noqa: E731
            per = "; ".join(
                f"{r['shape']} {med(r, cand):.4f} against "
                f"{med(r, base):.4f} ms ({ratio[r['shape']]:.3f}x)" for r in have)
            diff = max(r["baseline_max_abs_diff"] for r in have)
            who = label.removeprefix("tree:")
            rows.append({"target": f"candidate {who}: its time over its parent's, {what} "
                                   f"(geometric mean, {len(have)} shapes)",
                         "value": round(geo, 3), "unit": "x",
                         "note": f"{per}; outputs differ by at most {diff:.2g}"})
        dates.append(doc["info"]["date"].replace(" UTC", "Z").replace(" ", "T"))
    return {"date": max(dates), "rows": rows}


def grid_doc(path: Path, earlier: tuple[Path, str] | None = None) -> dict:
    """kernel_grid.json from bench_kernel.py --grid's JSON: each shape's best peer over kdalab
    (every time in the note), the geometric mean. ``earlier`` (a grid.json and its commit):
    the shapes this run did not time, from that run (its commit in the row's note); a run of
    some shapes only (``GRID_SHAPES``) completes an earlier whole one this way. ``--alt``'s
    candidate, where timed, in the shape's note."""
    doc = _grid_json(path)
    info = doc["info"]
    grid = [dict(r, based_on=doc.get("baseline_commit")) for r in doc["grid"] if "ratio" in r]
    runs = [(None, doc)]
    if earlier is not None:
        old = _grid_json(earlier[0])
        runs.append((earlier[1], old))
        have = {r["shape"] for r in grid}
        grid += [dict(r, commit=earlier[1], based_on=old.get("baseline_commit"))
                 for r in old["grid"] if "ratio" in r and r["shape"] not in have]
    rows = []
    for r in grid:
        times = ", ".join(f"{p} {r[f'{p}_ms']:.3f} ms" for p in ("kdalab", "fla", "flashkda")
                          if f"{p}_ms" in r)
        if "commit" in r:
            times += f" (commit {r['commit']}, {old['info']['date']})"
        elif "alt_over_default" in r:  # --alt's candidate, timed after the default
            times += (f"; [{doc['alt']}] {r['kdalab_alt_ms']:.3f} ms, "
                      f"{r['alt_over_default']:.3f}x the default's speed")
        if "kdalab_over_baseline" in r:  # --baseline: that run's earlier kernels, same process
            times += f"; {r['kdalab_over_baseline']:.3f}x {r['based_on']}'s kernels' time"
        rows.append({"target": f"{r['shape']}: best peer / kdalab", "value": round(r["ratio"], 3),
                     "unit": "x", "note": times})
    slowest = min(grid, key=lambda r: r["ratio"])
    geomean = _geomean([r["ratio"] for r in grid])
    rows.append({"target": f"geometric mean over the grid ({len(grid)} shapes)",
                 "value": round(geomean, 3), "unit": "x",
                 "note": f"slowest {slowest['shape']} {slowest['ratio']:.3f}x"})
    command = ("python benchmarks/bench_kernel.py --warm-peers && python "
               "benchmarks/bench_kernel.py --grid (benchmarks/h200.sh grid; peers in the same "
               "process)")
    for at, run in runs:
        based = [r["kdalab_over_baseline"] for r in run["grid"] if "kdalab_over_baseline" in r]
        if based:
            command += (f"; --baseline{f' (the run at {at})' if at else ''}: kdalab's time over "
                        f"{run['baseline_commit']}'s kernels (the same process, alternating "
                        f"rounds): geometric mean {_geomean(based):.3f} over {len(based)} shapes "
                        f"(range {min(based):.3f}-{max(based):.3f})")
    if earlier is not None or doc.get("alt") or doc.get("base"):
        command += (f"; this run: --shapes {','.join(r['shape'] for r in doc['grid'])}"
                    + (f" --alt {doc['alt']}" if doc.get("alt") else "")
                    + (f" --base {doc['base']} (the default's rows under it)"
                       if doc.get("base") else ""))
    return {"benchmark": "kernel_grid", "date": info["date"].replace(" UTC", "Z").replace(
        " ", "T"), "command": command, "rows": rows}


GPU_TESTS_AT, GPU_TESTS_END = "GPU tests at ", ": passed, of "


def gpu_test_label(target: str) -> str:
    """The label (a commit and what it names) of a ``gpu_test_row`` target: the text between
    its fixed head and its fixed ``: passed, of`` tail, so a label may hold colons too."""
    return target[len(GPU_TESTS_AT):target.rindex(GPU_TESTS_END)]


def gpu_test_row(runs: Path, commit: str) -> tuple[dict, str]:
    """One row from a ``gpu-tests`` step's JUnit file (RUNS/gpu-tests/gpu_tests.xml): the GPU
    tests that passed at ``commit``, what failed, erred, skipped or was cut off (pytest writes
    a nameless case when its time limit interrupts it), and the test files that ran (a
    ``TESTS_K`` selection runs some of them); the GPU's name where the step wrote it
    (gpu_name.txt); and the run's timestamp."""
    o = outcomes(runs / "gpu-tests" / "gpu_tests.xml")
    bad = {t: len(o[t]) for t in ("failure", "error", "skipped")}
    cut, files, when = len(o["cut off"]), o["files"], o["timestamp"] + "Z"
    ran = len(o["passed"]) + sum(bad.values())
    gpu = runs / "gpu-tests" / "gpu_name.txt"
    on = f" on {gpu.read_text().strip()}" if gpu.is_file() else ""
    return ({"target": f"{GPU_TESTS_AT}{commit}{GPU_TESTS_END}{ran} run",
             "unit": "tests", "value": len(o["passed"]),
             "note": f"{bad['failure']} failed, {bad['error']} errors, {bad['skipped']} skipped"
                     + (f", {cut} cut off by the step's time limit" if cut else "")
                     + f"; {when}{on}; {len(files)} test files: {', '.join(files)}"}, when)


def fold_short(rows: list[dict]) -> list[dict]:
    """The many-short rows, one a shape: kdalab vs FlashKDA, with fla's ratio and each
    candidate's speed-up over the default in its note (every figure kept, in fewer lines)."""
    out, extra = [], {}
    for r in rows:
        shape, _, what = r["target"].partition(": ")
        if what.startswith("kdalab vs fla") and what != "kdalab vs flashkda" or "speed-up" in what:
            label = "fla" if what.startswith("kdalab vs fla") else what.split("]")[0].split("[")[1]
            label += " (pruned)" if label in PRUNED else ""
            bits = f" ({r['note']})" if "speed-up" in what and r.get("note") else ""
            extra.setdefault(shape, []).append(f"{label} {r['value']}x{bits}")
        else:
            out.append(r)
    for r in out:
        shape = r["target"].partition(": ")[0]
        if r["target"].endswith("kdalab vs flashkda") and shape in extra:
            cands = any(not e.startswith("fla ") for e in extra[shape])
            r["note"] = (r.get("note", "") + "; " + ", ".join(extra[shape])
                         + (" (vs fla; [candidate] speed-up over the default)" if cands
                            else " (kdalab vs fla)"))
    return out


def fold_pool(rows: list[dict]) -> list[dict]:
    """The pool part's rows, one a shape: the checkpoints' cost over plain, with the pool's
    alone and a bf16 pool's checkpoints in its note (every figure kept, in fewer lines)."""
    extra, out = {}, []
    for r in rows:
        shape, _, what = r["target"].partition(": ")
        if what in ("pool_over_plain", "ck64_bf16_over_plain"):
            label = "pool alone" if what == "pool_over_plain" else "a bf16 pool's checkpoints"
            extra.setdefault(shape, []).append(f"{label} {r['value']}x")
        else:
            out.append(r)
    return [dict(r, note=r.get("note", "") + "; " + ", ".join(extra[shape]))
            if r["target"].endswith(": ck64_over_plain") and (
                shape := r["target"].partition(": ")[0]) in extra else r for r in out]


def note_ck_stagger(rows: list[dict], path: Path, commit: str) -> list[dict]:
    """The pruned staggered-start candidate's cost (``ck64_stagger<ns>_over_plain`` fields of
    a pool part's raw JSON, with the unstaggered cost of the same run) in the note of each
    shape's 64-token row."""
    found = {}
    for r in json.loads(path.read_text(encoding="utf-8"))["pool"]:
        ns = sorted(int(k[len("ck64_stagger"):-len("_over_plain")]) for k in r
                    if k.startswith("ck64_stagger") and k.endswith("_over_plain"))
        if ns:
            same = all(r.get(f"stagger{n}_same_bits") for n in ns)
            found[r["shape"]] = (
                f"[starts staggered {'/'.join(map(str, ns))} ns: "
                + "/".join(f"{r[f'ck64_stagger{n}_over_plain']:.3f}" for n in ns)
                + f"x against {r['ck64_over_plain']:.3f}x unstaggered in that run, "
                + ("the same bits" if same else "OTHER BITS") + f"; pruned, at {commit}]")
    return _add_notes(rows, ": ck64_over_plain", found)


def note_ck_intervals(rows: list[dict], path: Path, commit: str) -> list[dict]:
    """Each shape's cost of checkpoints every 128 and 256 tokens over the pool call (graph
    replay, fp32), read from ck_profile.py's JSON lines, in the note of its 64-token row."""
    found = {r["shape"]: (f"[every 128 / 256 tokens {r['ck128_graph_x']}x / "
                          f"{r['ck256_graph_x']}x: graph replay at {commit}]")
             for r in _json_lines(path) if "ck128_graph_x" in r}
    return _add_notes(rows, ": ck64_over_plain", found)


EARLIER_NOTE = re.compile(r"\[[^\[\]]* at [0-9a-f]{7,40}\]")


def note_earlier(rows: list[dict], before: list[dict]) -> list[dict]:
    """Each 64-token row with the bracketed notes of other runs (``[... at COMMIT]``, added
    by ``note_ck_stagger`` and ``note_ck_intervals`` from files of those runs) that the page's
    row of the same shape had: a new run keeps them without the earlier runs' files."""
    found: dict[str, list[str]] = {}
    for r in before:
        if r["target"].endswith(": ck64_over_plain"):
            shape = r["target"].removeprefix("prefill ").partition(":")[0]
            found[shape] = EARLIER_NOTE.findall(r.get("note", ""))
    for shape, notes in found.items():
        for note in notes:
            rows = _add_notes(rows, ": ck64_over_plain", {shape: note})
    return rows


def _add_notes(rows: list[dict], ending: str, found: dict[str, str]) -> list[dict]:
    """``rows`` with ``found[shape]`` added to the note of each prefill row of that shape
    whose target ends with ``ending``, unless the note has it already (a kept row may)."""
    out = []
    for r in rows:
        shape = r["target"].removeprefix("prefill ").partition(":")[0]
        if (r["target"].endswith(ending) and shape in found
                and found[shape] not in r.get("note", "")):
            r = dict(r, note=r.get("note", "") + "; " + found[shape])
        out.append(r)
    return out


def decode_rows(rows: list[dict]) -> list[dict]:
    """bench_decode's decode part, one row a shape: kdalab vs fla eager, with the graph
    replay's ratio, kdalab's times, the floor, a copy of the state's bytes alone (where the
    run timed one) and the host times in its note; the copy bandwidth as it is."""
    by = {}
    for r in rows:
        shape, _, what = r["target"].partition(": ")
        if shape.startswith("decode "):
            by.setdefault(shape, {})[what] = r
    out = [r for r in rows if "copy bandwidth (1 GiB d2d)" in r["target"]]
    for shape, parts in by.items():
        mine, vs = parts["kdalab"], parts.get("vs fla fused_recurrent_kda")
        if vs is None:  # fla skipped: kdalab's own figures only
            out.append(dict(mine, target=f"{shape}: kdalab (eager)"))
            continue
        over = parts["graph time over memory floor"]
        copy = f" ({over['note']})" if over.get("note") else ""
        out.append({"target": f"{shape}: kdalab vs fla fused_recurrent_kda (eager)",
                    "value": vs["value"], "unit": "x",
                    "note": f"{vs['note']}; kdalab eager {mine['value']} us, {mine['note']}; "
                            f"graph {over['value']}x the floor{copy}"})
    return out


#: bench_decode.py's rows kept for the page: the pool and checkpoint overheads, the peers,
#: the candidates still in the code, and the speed-up of a pruned candidate timed in the run
#: (its code at the run's commit; docs/kernels.md "Pruned" has them all; the copy bandwidth
#: is decode_h200's; value blocks of 128 on 8 warps measured 1.00x)
SERVING_KEEP = ("pool_over_plain", "ck64_over_plain", "ck64_bf16_over_plain", "kdalab vs",
                "[kend_single] speed-up", "[guard_launch] speed-up",
                "[guard_inline] speed-up", "[launch_triton] speed-up", "[launch_direct] speed-up")
#: candidates measured and deleted whose speed-up a kept run still shows (marked "pruned")
PRUNED: tuple[str, ...] = ()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--device", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the folder of result files read (earlier serving rows) and written "
                         "(default: benchmarks/results)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-grad", action="store_true",
                    help="check_grad_h200.json from RUNS/check-grad (a run of some kernels "
                         "keeps the others' rows, tagged with their commit)")
    ap.add_argument("--hunt", action="store_true")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--grid-earlier", nargs=2, metavar=("GRID_JSON", "COMMIT"), default=None,
                    help="--grid: the shapes RUNS did not time, from this earlier run")
    ap.add_argument("--serving", action="store_true")
    ap.add_argument("--ck-intervals", nargs=2, metavar=("JSONL", "COMMIT"), default=None,
                    help="--serving: the longer checkpoint intervals' cost (graph replay) "
                         "from the one-off ck_profile.py's output (scripts/device/ at baefdd0) "
                         "into the notes of the 64-token rows")
    ap.add_argument("--ck-stagger", nargs=2, metavar=("RAW_JSON", "COMMIT"), default=None,
                    help="--serving: the pruned staggered-start candidate's cost from a pool "
                         "part's decode.raw.json (bench_decode.py --ck-stagger at COMMIT) "
                         "into the notes of the 64-token rows")
    ap.add_argument("--decode", action="store_true",
                    help="decode_h200.json from RUNS/serving/decode.json's decode part")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--grid-alt", nargs="+", type=Path, default=None, metavar="RUNS",
                    help="grid steps' folders run with GRID_ALT (one candidate each): "
                         "kernel_candidates_h200.json")
    ap.add_argument("--baseline-runs", nargs="+", default=None, metavar="LABEL=JSON",
                    help="bench_kernel.py --grid --baseline JSON files whose baselines are "
                         "candidates (LABEL: the candidate's commit): the page --page names")
    ap.add_argument("--page", default=None,
                    help="the name of the page written by the one of --baseline-runs (which "
                         "needs it), --grid, --grid-alt, --serving, --hunt, --decode and "
                         "--check-grad "
                         "given, instead of its own (kernel_grid, kernel_candidates_h200, "
                         "serving_prefill_h200, hunt_h200, decode_h200, check_grad_h200): e.g. "
                         "kernel_grid_h100 for a run on the card lent for an H200")
    ap.add_argument("--page-command", default="", help="--baseline-runs: the commands run")
    ap.add_argument("--gpu-tests", nargs=2, action="append", metavar=("RUNS", "COMMIT"),
                    default=None, help="a gpu-tests step's folder and its commit (repeat: the "
                                       "latest first, e.g. a selection, then the last whole run)")
    a = ap.parse_args()
    # what each option reads: a missing file is one line and exit 2 before anything is written
    needs = {"check": ["check/check.json", "check/records.json"],
             "check_grad": ["check-grad/check.json", "check-grad/records.json"],
             "grid": ["grid/grid.json"], "serving": ["serving/decode.json"],
             "decode": ["serving/decode.json"], "sweep": ["sweep/sweep_ab_h200.json"]}
    for option, files in needs.items():
        for name in files if getattr(a, option) else ():
            if not (a.runs / name).is_file():
                ap.error(f"--{option.replace('_', '-')}: {a.runs / name} does not exist (unpack "
                         f"the step's $OUT/<step>.tar.gz into {a.runs})")
    paged = [o for o in ("baseline_runs", "grid", "grid_alt", "serving", "hunt", "decode",
                         "check_grad") if getattr(a, o)]
    if a.page is not None and len(paged) != 1:
        ap.error(f"--page names the page of one of --baseline-runs, --grid, --grid-alt, "
                 f"--serving, --hunt, --decode, --check-grad; given {len(paged)} of them")
    for runs, _ in a.gpu_tests or ():
        if not (Path(runs) / "gpu-tests" / "gpu_tests.xml").is_file():
            ap.error(f"--gpu-tests: {Path(runs) / 'gpu-tests' / 'gpu_tests.xml'} does not exist")
    if a.hunt and not any((p / "worst.json").exists() for p in a.runs.glob("hunt-*")):
        ap.error(f"--hunt: no {a.runs}/hunt-*/worst.json")
    if a.gpu_tests:
        found = [gpu_test_row(Path(runs), commit) for runs, commit in a.gpu_tests]
        rows = [row for row, _ in found]
        path = a.results / "gpu_tests_h200.json"
        commits = [c for _, c in a.gpu_tests]
        if path.exists():  # the page's earlier calls stay, after this one (newest first)
            before = json.loads(path.read_text(encoding="utf-8"))
            kept = [r for r in before["rows"] if gpu_test_label(r["target"]) not in commits]
            rows += kept
            commits += [gpu_test_label(r["target"]) for r in kept]
        _write(a.results, "gpu_tests_h200", {
            "benchmark": "gpu_tests_h200", "device": a.device, "date": found[0][1],
            "commit": ", ".join(commits), "command": "bash scripts/device/gpu_tests.sh "
            "[-k SELECTION] (benchmarks/h200.sh gpu-tests [TESTS_K]); it fails on any skip",
            "rows": rows})
    if a.baseline_runs:
        runs = [tuple(x.split("=", 1)) for x in a.baseline_runs]
        bad = [x for x in a.baseline_runs if "=" not in x]
        if bad or not a.page:
            ap.error(f"--baseline-runs: LABEL=JSON each, and --page NAME ({bad or 'no --page'})")
        for _, p in runs:
            if not Path(p).is_file():
                ap.error(f"--baseline-runs: {p} does not exist")
        _write(a.results, a.page, {
            "benchmark": a.page, "device": a.device, "commit": a.commit,
            "command": a.page_command,
            **baseline_doc([(label, Path(p)) for label, p in runs])})
    if a.grid:
        earlier = (Path(a.grid_earlier[0]), a.grid_earlier[1]) if a.grid_earlier else None
        name = a.page or "kernel_grid"
        _write(a.results, name, {**grid_doc(a.runs / "grid" / "grid.json", earlier),
                                 "benchmark": name, "device": a.device, "commit": a.commit})
    if a.grid_alt:
        for runs in a.grid_alt:
            if not (runs / "grid" / "grid.json").is_file():
                ap.error(f"--grid-alt: {runs / 'grid' / 'grid.json'} does not exist")
        name = a.page or "kernel_candidates_h200"
        _write(a.results, name, {
            **alt_doc([runs / "grid" / "grid.json" for runs in a.grid_alt]),
            "benchmark": name, "device": a.device, "commit": a.commit})
    if a.serving:
        doc = json.loads((a.runs / "serving" / "decode.json").read_text(encoding="utf-8"))
        rows = [r for r in doc["rows"] if any(k in r["target"] for k in SERVING_KEEP)]
        name = a.page or "serving_prefill_h200"
        path = a.results / f"{name}.json"  # a new page has no earlier rows
        before = (json.loads(path.read_text(encoding="utf-8")) if path.exists()
                  else {"rows": [], "commit": a.commit, "date": doc["date"]})
        # a run without one of the parts (SERVING_PARTS=short, or =pool): the page's rows of
        # that part stay, marked with the commit and date they were measured at
        for part in ("_over_plain", "kdalab vs"):  # the pool part's rows, the short part's
            if not any(part in r["target"] for r in rows):
                rows += kept_rows(before, lambda r, part=part: part in r["target"])
        rows = note_earlier(fold_pool(fold_short(rows)), before["rows"])
        if a.ck_stagger:
            rows = note_ck_stagger(rows, Path(a.ck_stagger[0]), a.ck_stagger[1])
        if a.ck_intervals:
            rows = note_ck_intervals(rows, Path(a.ck_intervals[0]), a.ck_intervals[1])
        _write(a.results, name, {
            "benchmark": name, "device": a.device, "date": doc["date"],
            "commit": a.commit, "command": doc["command"].replace("/root/out/", "$OUT/").replace(
                "/tmp/kd/serving/", "$OUT/") + " (benchmarks/h200.sh serving)",
            "rows": rows})
    if a.decode:
        doc = json.loads((a.runs / "serving" / "decode.json").read_text(encoding="utf-8"))
        rows = decode_rows(doc["rows"])
        name = a.page or "decode_h200"
        path = a.results / f"{name}.json"
        if path.exists():  # the page's shapes this run did not time (--ns) stay, tagged
            before = json.loads(path.read_text(encoding="utf-8"))
            shape = lambda r: r["target"].split(":")[0]  # noqa: E731
            ran = {shape(r) for r in rows}
            rows += kept_rows(before, lambda r: shape(r) not in ran  # one copy bandwidth: the run's
                              and "copy bandwidth" not in r["target"])
            key = lambda r: [int(x) if x.isdigit() else x for x in  # noqa: E731
                             re.findall(r"\d+|\D+", shape(r))]
            rows = rows[:1] + sorted(rows[1:], key=key)
        _write(a.results, name, {
            "benchmark": name, "device": a.device, "date": doc["date"],
            "commit": a.commit, "command": doc["command"].replace(
                "/tmp/kd/serving/", "$OUT/") + " (benchmarks/h200.sh serving, "
            "SERVING_PARTS including decode; peers in the same process)",
            "rows": rows})
    if a.sweep:
        doc = json.loads((a.runs / "sweep" / "sweep_ab_h200.json").read_text(encoding="utf-8"))
        _write(a.results, "sweep_command_h200", {
            **doc, "benchmark": "sweep_command_h200", "device": a.device, "commit": a.commit,
            "command": doc["command"].replace("/tmp/kd/sweep/", "$OUT/")
            + " (benchmarks/h200.sh sweep)"})
    if a.check:
        run, rows = check_rows(a.runs / "check")
        command = (run["command"] + " (benchmarks/h200.sh check"
                   + ("" if run.get("complete") else "; INCOMPLETE") + ")")
        # a run of some kernels (CHECK_KERNELS=kdalab): the others' rows stay, marked with the
        # commit and date they were measured at
        path = a.results / "check_h200.json"
        before = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        subset = "--cases" in run["command"]
        if subset:  # some cases only (CHECK_CASES): their groups' rows, beside the suite's
            rows = [r for r in rows if any(f"{g} group" in r["target"] for g in GROUPS)]
            cases = run["command"].split("--cases ")[1].split()[0]
            rows = [dict(r, note=r["note"] + f" (commit {a.commit}, {run['date']}; h200.sh "
                         f"check, CHECK_CASES {cases})") for r in rows]
        date, commit = run["date"].replace(" ", "T") + "Z", a.commit
        if before is not None and subset:  # the page stays the suite's run, this one's rows
            new = {r["target"] for r in rows}  # name it in their notes
            rows = [r for r in before["rows"] if r["target"] not in new] + rows
            command, date, commit = before["command"], before["date"], before["commit"]
        elif before is not None:
            kept = kept_rows(before, lambda r: r["target"].split(":")[0] not in run["kernels"])
            rows += kept
            if kept:
                command += f"; the other kernels' rows: {before['command']}"
        _write(a.results, "check_h200", {
            "benchmark": "check_h200", "device": a.device, "date": date, "commit": commit,
            "command": command, "rows": rows})
    if a.check_grad:
        run, rows = check_grad_rows(a.runs / "check-grad")
        command = (run["command"].replace("/tmp/kd/check-grad/", "$OUT/")
                   + " (benchmarks/h200.sh check-grad; report in docs/check-grad/)")
        name = a.page or "check_grad_h200"
        path = a.results / f"{name}.json"
        if path.exists():
            before = json.loads(path.read_text(encoding="utf-8"))
            kept = kept_rows(before, lambda r: r["target"].split(":")[0].split()[-1]
                             not in run["kernels"])
            rows += kept
            if kept:  # docs/check-grad/ now holds this run's report: the earlier one is in git
                command += "; the other kernels' rows: " + before["command"].replace(
                    "report in docs/check-grad/", f"its report: docs/check-grad/ at "
                    f"{before['commit'].split()[0]}")
        _write(a.results, name, {
            "benchmark": name, "device": a.device,
            "date": run["date"].replace(" ", "T") + "Z", "commit": a.commit,
            "command": command, "rows": rows})
    if a.hunt:
        folders = sorted(p for p in a.runs.glob("hunt-*") if (p / "worst.json").exists())
        metas = [json.loads((p / "hunt.json").read_text(encoding="utf-8")) for p in folders]
        dates = [m["date"] for m in metas if "date" in m]
        rows, commit, command = hunt_rows(folders), a.commit, (
            "kdalab hunt TARGET --device cuda --seed 0 (benchmarks/h200.sh hunt, hunts; kdalab "
            "--dims 64,128, two calls with --resume; fla pinned to T = 1024, H = 4, K = 128; "
            "FlashKDA K = 128)")
        name = a.page or "hunt_h200"
        path = a.results / f"{name}.json"
        if path.exists():  # a hunt of some targets: the page's other rows stay, with their runs
            before = json.loads(path.read_text(encoding="utf-8"))
            ran = {r["target"].split(":")[0] for r in rows}
            kept = [r for r in before["rows"] if r["target"].split(":")[0] not in ran]
            if kept:
                rows += kept
                commit = (f"{a.commit} ({', '.join(sorted(ran))}); "
                          f"the other rows: {before['commit']}")
                command = (before["command"] if before["command"].startswith(command)  # once
                           else f"{command}; the other rows: {before['command']}")
        _write(a.results, name, {
            "benchmark": name, "device": a.device,
            "date": max(dates) if dates else "", "commit": commit, "command": command,
            "rows": rows})

if __name__ == "__main__":
    main()

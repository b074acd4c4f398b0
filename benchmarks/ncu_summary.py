"""The backward kernels' Nsight Compute figures as a results page: from
``benchmarks/h200.sh ncu``'s details text (``ncu -i REP --page details``) and source CSV
(``--page source --csv --print-source sass``, gzipped or not), one row a kernel launch: its
duration, issue-slot use, occupancy, DRAM throughput, executed warp instructions and local
(spill) requests, and where its warps stall (the sampled stall reasons' shares).

    python benchmarks/ncu_summary.py --details D.txt [D2.txt] --sass S.csv.gz [S2.csv.gz] \\
        --device "NVIDIA H100 80GB HBM3" --commit SHA --json benchmarks/results/ncu_bwd_h100.json
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import re
import sys
import time

#: the details page's metrics kept, by their names there
METRICS = {"Duration": "duration_us", "Issue Slots Busy": "issue_busy_pct",
           "Achieved Occupancy": "occupancy_pct", "DRAM Throughput": "dram_pct",
           "Registers Per Thread": "registers", "Executed Instructions": "instructions",
           "Local Memory Spilling Requests": "spill_requests",
           "Warp Cycles Per Issued Instruction": "cycles_per_issue"}
_LAUNCH = re.compile(r"^  (\w+) \((\d+), (\d+), (\d+)\)x\((\d+), 1, 1\)")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def read_details(text: str) -> list[dict]:
    """One dict a kernel launch of a details page: its name, grid, and ``METRICS``."""
    out = []
    for line in text.splitlines():
        m = _LAUNCH.match(line)
        if m:
            out.append(dict(kernel=m.group(1), grid="x".join(m.group(2, 3, 4))))
            continue
        parts = line.split()
        for name, key in METRICS.items():
            if out and line.strip().startswith(name + " ") and key not in out[-1]:
                try:
                    out[-1][key] = _number(parts[-1])
                except ValueError:
                    pass
    return out


def read_stalls(text: str) -> dict[str, collections.Counter]:
    """The sampled stall reasons of each kernel of a source CSV, summed over its SASS lines
    (the "(Not Issued)" columns left out: a subset of the same samples)."""
    out: dict[str, collections.Counter] = {}
    kernel, header = None, None
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0] == "Kernel Name":
            kernel, header = row[1], None
            out.setdefault(kernel, collections.Counter())
        elif row and row[0] == "Address":
            header = row
        elif header and kernel and len(row) == len(header):
            for name, value in zip(header, row):
                if name.startswith("stall_") and "Not Issued" not in name and value:
                    out[kernel][name[len("stall_"):]] += _number(value)
    return out


def rows(launches: list[dict], stalls: dict[str, collections.Counter]) -> list[dict]:
    out = []
    for x in launches:
        s = stalls.get(x["kernel"], collections.Counter())
        total = sum(s.values()) or 1.0
        top = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in s.most_common(6))
        note = (f"grid {x['grid']}; issue slots busy {x.get('issue_busy_pct', 0):g} %, "
                f"{x.get('cycles_per_issue', 0):g} cycles a warp's issue; occupancy "
                f"{x.get('occupancy_pct', 0):g} % ({x.get('registers', 0):g} registers); "
                f"DRAM {x.get('dram_pct', 0):g} % of its peak; "
                f"{x.get('instructions', 0) / 1e6:.1f} M warp instructions, "
                f"{x.get('spill_requests', 0) / 1e6:.2f} M local (spill) requests; stalls "
                f"(sampled, the kernel's launches in the CSV pooled): {top or 'none read'}")
        out.append(dict(target=f"{x['kernel']} ({x['grid']}): duration under Nsight Compute",
                        value=x.get("duration_us"), unit="us", note=note))
    return out


def _read(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return fh.read()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--details", nargs="+", required=True)
    ap.add_argument("--sass", nargs="+", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    try:
        launches = [x for p in a.details for x in read_details(_read(p))]
        stalls: dict[str, collections.Counter] = {}
        for p in a.sass:
            stalls.update(read_stalls(_read(p)))
    except OSError as exc:
        print(f"ncu_summary: {exc}", file=sys.stderr)
        return 2
    if not launches:
        print("ncu_summary: no kernel launch in --details", file=sys.stderr)
        return 2
    doc = dict(benchmark="ncu_bwd_h100", device=a.device, commit=a.commit,
               date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), command=a.command,
               rows=rows(launches, stalls))
    with open(a.json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

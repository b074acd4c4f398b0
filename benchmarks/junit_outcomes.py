#!/usr/bin/env python3
"""The outcomes of a pytest JUnit file, read one way for the two places that judge a GPU-test
call: ``scripts/device/gpu_tests.sh`` (its verdict, on the device) and
``benchmarks/collect_h200.py`` (the ``gpu_tests_h200`` row, here).

    python3 benchmarks/junit_outcomes.py REPORT.xml   # a summary; exit 1 on anything not passed

A case with no name is a test that pytest's interruption (the step's time limit) cut off: it
counts as neither passed nor run, and fails the verdict like a failure.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

BAD = ("failure", "error", "skipped", "cut off")


def outcomes(report: Path | str) -> dict:
    """{'passed', 'failure', 'error', 'skipped', 'cut off': [test ids]} with 'files' (the test
    modules that ran, sorted) and 'timestamp' (the run's start, ISO, to the minute)."""
    root = ET.parse(report).getroot()
    cases = list(root.iter("testcase"))
    named = [c for c in cases if c.get("name")]
    out = {t: [f"{c.get('classname')}::{c.get('name')}" for c in named if c.find(t) is not None]
           for t in ("failure", "error", "skipped")}
    out["cut off"] = [c.get("classname") or "?" for c in cases if not c.get("name")]
    out["passed"] = [f"{c.get('classname')}::{c.get('name')}" for c in named
                     if not any(c.find(t) is not None for t in ("failure", "error", "skipped"))]
    out["files"] = sorted({c.get("classname").rsplit(".", 1)[-1] for c in named})
    suite = next(root.iter("testsuite"), None)
    out["timestamp"] = (suite.get("timestamp", "") if suite is not None else "")[:16]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: junit_outcomes.py REPORT.xml", file=sys.stderr)
        return 2
    o = outcomes(argv[0])
    ran = len(o["passed"]) + sum(len(o[t]) for t in BAD[:3])
    print(f"gpu_tests.sh: {ran} GPU tests, " + ", ".join(f"{len(o[t])} {t}" for t in BAD))
    for t in BAD:
        for name in o[t]:
            print(f"  {t}: {name}")
    return 1 if not ran or any(o[t] for t in BAD) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

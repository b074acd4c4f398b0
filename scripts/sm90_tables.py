#!/usr/bin/env python3
"""Install the H200 instruction tables that scripts/device/flashkda_golden.py measured as
kdalab's package data (``src/kdalab/arith/data/sm90_*.npz``), keeping only what
:mod:`kdalab.arith.sm90` reads (whole-binade tables as bit differences and the summaries), and
the run's outputs the models are tested against (``tests/data/flashkda/sm90_checks.npz``:
tanh.approx and FlashKDA's sigmoid on every bf16 input, ex2.approx around its flush to zero).

    python scripts/sm90_tables.py DIR   # with flashkda_sfu_tanh.npz, flashkda_sfu_ex2_rsqrt.npz

Prints the size of each file written and what the models now read from measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "src" / "kdalab" / "arith" / "data"
CHECKS = ROOT / "tests" / "data" / "flashkda" / "sm90_checks.npz"
KEEP = {
    "tanh": lambda k: k == "summary_json" or (k[:1] in "ebd" and k[1:].lstrip("-").isdigit()),
    "ex2_rsqrt": lambda k: k in ("ex2__frac_ulp", "ex2__summary_json", "rsqrt__e0_ulp",
                                 "rsqrt__e1_ulp", "rsqrt__summary_json"),
}
#: the tests' name for each checked output, from its name in the device files
CHECKED = {"bf16_in": "bf16_in", "bf16_tanh": "bf16_tanh", "bf16_sigmoid": "bf16_sigmoid",
           "ex2__edge_in": "ex2_edge_in", "ex2__edge_out": "ex2_edge_out"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--dest", type=Path, default=DEST)
    ap.add_argument("--checks", type=Path, default=CHECKS)
    args = ap.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    checks = {}
    for stem, keep in KEEP.items():
        src = args.dir / f"flashkda_sfu_{stem}.npz"
        if not src.exists():
            print(f"{src}: no such file", file=sys.stderr)
            return 2
        with np.load(src) as z:
            arrays = {k: z[k] for k in z.files if keep(k)}
            checks.update({CHECKED[k]: z[k] for k in z.files if k in CHECKED})
        for key in [k for k in arrays if k[:1] == "e" and k[1:].lstrip("-").isdigit()]:
            bits = arrays.pop(key).view(np.int32).astype(np.int64)  # as bit differences
            arrays["b" + key[1:]] = bits[:1]
            d = np.diff(bits)
            arrays["d" + key[1:]] = d.astype(np.int16 if np.abs(d).max(initial=0) < 2**15
                                              else np.int32)
        out = args.dest / f"sm90_{stem}.npz"
        np.savez_compressed(out, **arrays)
        print(f"{out}: {len(arrays)} arrays, {out.stat().st_size / 2**20:.2f} MiB")
    if set(checks) != set(CHECKED.values()):
        print(f"{args.dir}: no {', '.join(sorted(set(CHECKED.values()) - set(checks)))}; "
              f"{args.checks} not written", file=sys.stderr)
    else:
        args.checks.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.checks, **checks)
        print(f"{args.checks}: {args.checks.stat().st_size / 2**20:.2f} MiB")
    from kdalab.arith import sm90

    before = os.environ.get("KDALAB_SM90_DATA")
    os.environ["KDALAB_SM90_DATA"] = str(args.dest)
    try:
        sm90.reload()
        for name, what in sm90.measured().items():
            print(f"{name}: {what}")
    finally:
        if before is None:
            del os.environ["KDALAB_SM90_DATA"]
        else:
            os.environ["KDALAB_SM90_DATA"] = before
        sm90.reload()
    return 0


if __name__ == "__main__":
    sys.exit(main())

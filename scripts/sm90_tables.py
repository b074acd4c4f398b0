#!/usr/bin/env python3
"""Install the H200 instruction tables that scripts/device/flashkda_golden.py measured as
kdalab's package data (``src/kdalab/arith/data/sm90_*.npz``), keeping only what
:mod:`kdalab.arith.sm90` reads (whole-binade tables as bit differences, FlashKDA's sigmoid on
every bf16 input, the summaries; not the samples).

    python scripts/sm90_tables.py DIR   # with flashkda_sfu_tanh.npz, flashkda_sfu_ex2_rsqrt.npz

Prints the size of each file written and what the models now read from measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

DEST = Path(__file__).resolve().parents[1] / "src" / "kdalab" / "arith" / "data"
KEEP = {
    "tanh": lambda k: k in ("summary_json", "bf16_in", "bf16_sigmoid")
    or (k[:1] in "ebd" and k[1:].lstrip("-").isdigit()),
    "ex2_rsqrt": lambda k: k in ("ex2__frac_ulp", "ex2__summary_json", "rsqrt__e0_ulp",
                                 "rsqrt__e1_ulp", "rsqrt__summary_json"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--dest", type=Path, default=DEST)
    args = ap.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    for stem, keep in KEEP.items():
        src = args.dir / f"flashkda_sfu_{stem}.npz"
        if not src.exists():
            print(f"{src}: no such file", file=sys.stderr)
            return 2
        with np.load(src) as z:
            arrays = {k: z[k] for k in z.files if keep(k)}
        for key in [k for k in arrays if k[:1] == "e" and k[1:].lstrip("-").isdigit()]:
            bits = arrays.pop(key).view(np.int32).astype(np.int64)  # as bit differences
            arrays["b" + key[1:]] = bits[:1]
            d = np.diff(bits)
            arrays["d" + key[1:]] = d.astype(np.int16 if np.abs(d).max(initial=0) < 2**15
                                              else np.int32)
        out = args.dest / f"sm90_{stem}.npz"
        np.savez_compressed(out, **arrays)
        print(f"{out}: {len(arrays)} arrays, {out.stat().st_size / 2**20:.2f} MiB")
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

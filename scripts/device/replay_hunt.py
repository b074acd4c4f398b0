#!/usr/bin/env python3
"""Replay a hunt's worst trials on other kernels: is a hunt's finding the kernel's or the draw's?

    python scripts/device/replay_hunt.py HUNT_FOLDER --targets kdalab,kdalab_baseline:chunk_kda_fwd \
        [--top 20] [--device cuda] [--json PATH]

Reads HUNT_FOLDER/trials.jsonl (each record carries its spec and draw seed), takes the ``--top``
trials with the largest output error, and measures each target on each of them with the hunt's
own evaluation (``kdalab.hunt.evaluate.evaluate``: relative RMS error of the output and the final
state against the fp64 recurrence). A target is any kernel ``kdalab check`` loads; an earlier
commit's kernels are ``kdalab_baseline:chunk_kda_fwd`` with its folder on PYTHONPATH
(``scripts/baseline_kernels.sh COMMIT DIR``). One JSON line per trial and target, then a table.
"""

from __future__ import annotations

import argparse
import json
import sys

from kdalab.hunt.evaluate import evaluate
from kdalab.hunt.files import read_trials
from kdalab.hunt.target import TargetError, resolve
from kdalab.inputs.sequences import SequenceSpec


def top_trials(records: list[dict], n: int) -> list[dict]:
    """The ``n`` measured trials with the largest output error, largest first."""
    measured = [r for r in records if r.get("status") == "measured"
                and r.get("output_error") is not None and r.get("spec")]
    return sorted(measured, key=lambda r: -r["output_error"])[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--targets", required=True, help="comma-separated kernels")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from pathlib import Path

    import torch

    def fail(message: str) -> int:  # bad input: one line, exit 2, nothing measured
        print(f"replay_hunt: {message}", file=sys.stderr)
        return 2

    if args.top < 1:
        return fail(f"--top must be at least 1, got {args.top}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("--device cuda: this machine has no CUDA device")
    if not (Path(args.folder) / "trials.jsonl").is_file():
        return fail(f"{args.folder}: no trials.jsonl (a kdalab hunt folder)")
    trials = top_trials(read_trials(Path(args.folder)), args.top)
    if not trials:
        return fail(f"no measured trial in {args.folder}")
    try:
        targets = {name: resolve(name, args.device) for name in args.targets.split(",")}
    except TargetError as exc:
        return fail(f"--targets: {exc}")
    rows = []
    for rec in trials:
        spec = SequenceSpec.from_dict(rec["spec"])
        row = {"trial": rec["trial"], "seed": rec["seed"], "hunt_output_error": rec["output_error"]}
        for name, target in targets.items():
            got = evaluate(target, spec, rec["seed"])
            row[name] = got["output_error"]
            row[f"{name}_state"] = got["state_error"]
            row["bf16_floor"] = got["bf16_floor"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    names = list(targets)
    print("trial  hunt      " + "  ".join(f"{n[:24]:>24}" for n in names) + "  bf16 floor")
    for r in rows:
        print(f"{r['trial']:>5}  {r['hunt_output_error']:.3e}  "
              + "  ".join(f"{r[n]:>24.3e}" if r[n] is not None else f"{'-':>24}" for n in names)
              + f"  {r['bf16_floor']:.3e}")
    for n in names:
        vals = [r[n] for r in rows if r[n] is not None]
        if vals:
            print(f"{n}: worst {max(vals):.3e} over {len(vals)} trials")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

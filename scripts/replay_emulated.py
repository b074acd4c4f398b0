#!/usr/bin/env python3
"""A hunt's worst trials measured again on the CPU, in the Triton interpreter with the H200's
arithmetic emulated (tests/h200_arith.py: tf32 products truncating their fp32 operands, bf16
stores rounding to nearest): does a GPU hunt's finding come back on the CPU, and does a change
remove it, with no device?

    python scripts/replay_emulated.py HUNT_FOLDER [--top 16] [--part 0/1] [--target kdalab]
        [--json PATH]

Reads HUNT_FOLDER/trials.jsonl (each record carries its spec and draw seed), takes the ``--top``
measured trials with the largest output error (``--part i/n``: every n-th of them from the
i-th, to share them among processes), and measures ``--target`` (a kernel ``kdalab check``
loads, on the CPU) on each with the hunt's evaluation (``kdalab.hunt.evaluate``). Prints one
JSON line per trial, its hunt figures beside the emulated ones, then the worst of each.
Trials of T in the thousands take seconds to a minute each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.h200_arith import h200_arithmetic  # noqa: E402

from kdalab.hunt.evaluate import evaluate  # noqa: E402
from kdalab.hunt.target import TargetError, resolve  # noqa: E402
from kdalab.inputs.sequences import SequenceSpec  # noqa: E402


def read_records(path: Path) -> list[dict]:
    """trials.jsonl's records, read only (``kdalab.hunt.files.read_trials`` would cut a torn
    last line from the file: this folder is the hunt's, not this script's); a line that is not
    a JSON object (a torn last one) is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def worst_trials(records: list[dict], n: int) -> list[dict]:
    """The ``n`` measured trials with the largest output error, largest first."""
    measured = [r for r in records if r.get("status") == "measured"
                and r.get("output_error") is not None and r.get("spec")]
    return sorted(measured, key=lambda r: -r["output_error"])[:n]


def part(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise argparse.ArgumentTypeError(f"--part: I/N with 0 <= I < N, got {text!r}")
    return int(i), int(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--part", type=part, default=(0, 1))
    ap.add_argument("--target", default="kdalab")
    ap.add_argument("--json", type=Path, default=None, help="also write the lines here")
    args = ap.parse_args(argv)
    if not (args.folder / "trials.jsonl").is_file():
        ap.error(f"HUNT_FOLDER: no trials.jsonl in {args.folder}")
    if args.top < 1:
        ap.error(f"--top: at least 1, got {args.top}")
    try:
        target = resolve(args.target, "cpu")
    except TargetError as e:
        ap.error(f"--target: {e}")
    measured = worst_trials(read_records(args.folder / "trials.jsonl"), args.top)
    if not measured:
        ap.error(f"HUNT_FOLDER: no measured trial with its spec in {args.folder}/trials.jsonl")
    i, n = args.part
    trials = measured[i::n]
    lines = []
    with h200_arithmetic() as counts:
        for r in trials:
            e = evaluate(target, SequenceSpec.from_dict(r["spec"]), r["seed"])
            line = dict(trial=r.get("trial"), hunt_output=r["output_error"],
                        hunt_state=r.get("state_error"), status=e["status"],
                        output=e["output_error"], state=e["state_error"],
                        nonfinite=(e["output_nonfinite"] or 0) + (e["state_nonfinite"] or 0),
                        seconds=round(e["seconds"] or 0.0, 2))
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.json:
        args.json.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = [x for x in lines if x["status"] == "measured"]
    if done:
        print(f"{len(done)} trials, {args.target} emulated: worst output "
              f"{max(x['output'] for x in done):.3e}, state {max(x['state'] for x in done):.3e}; "
              f"the hunt's: {max(x['hunt_output'] for x in done):.3e} "
              f"({counts['tf32_products'][0]} tf32 products, "
              f"{counts['bf16_stores'][0]} bf16 conversions emulated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

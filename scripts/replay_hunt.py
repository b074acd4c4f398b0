#!/usr/bin/env python3
"""A hunt's worst trials measured again, on other kernels or on the CPU: is a hunt's finding
the kernel's or the draw's, and does a change remove it, with or without a device?

    python scripts/replay_hunt.py HUNT_FOLDER [--targets kdalab[,kdalab_baseline:chunk_kda_fwd]]
        [--device cpu|cuda] [--top 16] [--part I/N] [--json PATH]

Reads HUNT_FOLDER/trials.jsonl, only reading it (each record carries its spec and draw seed),
takes the ``--top`` measured trials with the largest output error (``--part I/N``: every N-th
of them from the I-th, to share them among processes), and measures each target on each with
the hunt's own evaluation (``kdalab.hunt.evaluate``: relative RMS error of the output and of
the final state against the fp64 recurrence). A ``hunt --grad`` folder (its hunt.json says
``"grad": true``) is replayed as it was hunted: the trials with the largest worst-gradient
error, each gradient measured again against autograd through the fp64 recurrence. A target
is any kernel ``kdalab check`` loads; an earlier commit's kernels are
``kdalab_baseline:chunk_kda_fwd``, their folder on PYTHONPATH (``scripts/baseline_kernels.sh
COMMIT DIR``).

``--device cpu`` (the default) runs the Triton interpreter with the GPU's arithmetic emulated
(tests/h200_arith.py: tf32 products truncating their fp32 operands, bf16 stores rounding to
nearest; on the b02b3af hunt's worst trials its outputs were 0.91-0.96 of the H200's, its
states 0.96-1.01: docs/hunt.md); trials of T in the thousands take seconds to a minute each.
``--device cuda`` runs on the GPU. Prints one JSON line per trial, then a table and each
target's worst; ``--json`` writes the lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def part(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
        raise argparse.ArgumentTypeError(f"I/N with 0 <= I < N, got {text!r}")
    return int(i), int(n)


def worst_trials(records: list[dict], n: int, key: str = "output_error") -> list[dict]:
    """The ``n`` measured trials with the largest ``key`` (output_error, or a gradient hunt's
    grad_error), largest first."""
    measured = [r for r in records if r.get("status") == "measured"
                and r.get(key) is not None and r.get("spec")]
    return sorted(measured, key=lambda r: -r[key])[:n]


def hunted_gradients(folder: Path) -> bool:
    """Whether the hunt in ``folder`` searched gradients (its hunt.json's ``grad``; a folder
    without one, an output hunt)."""
    path = folder / "hunt.json"
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text()).get("grad", False))
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{path} is not a hunt's summary ({exc})") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, metavar="HUNT_FOLDER")
    ap.add_argument("--targets", default="kdalab", help="comma-separated kernels")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--part", type=part, default=(0, 1))
    ap.add_argument("--json", type=Path, default=None, help="also write the lines here")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top: at least 1, got {args.top}")
    if not (args.folder / "trials.jsonl").is_file():
        ap.error(f"HUNT_FOLDER: no trials.jsonl in {args.folder}")
    try:
        grad = hunted_gradients(args.folder)
    except ValueError as exc:
        ap.error(f"HUNT_FOLDER: {exc}")
    key = "grad_error" if grad else "output_error"
    cpu = args.device == "cpu"
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    sys.path.insert(0, str(ROOT))
    import torch

    from kdalab.check.tensors import GRADIENTS
    from kdalab.hunt.evaluate import evaluate
    from kdalab.hunt.files import read_trials
    from kdalab.hunt.target import TargetError, resolve
    from kdalab.inputs.sequences import SequenceSpec

    if not cpu and not torch.cuda.is_available():
        ap.error("--device cuda: this machine has no CUDA device")
    try:
        targets = {name: resolve(name, args.device, grad=grad)
                   for name in args.targets.split(",")}
    except TargetError as exc:
        ap.error(f"--targets: {exc}")
    try:
        records = read_trials(args.folder, repair=False)
    except ValueError as exc:
        ap.error(f"HUNT_FOLDER: {exc}")
    trials = worst_trials(records, args.top, key)[args.part[0]::args.part[1]]
    if not trials:
        ap.error(f"HUNT_FOLDER: no measured trial with its spec in {args.folder}/trials.jsonl")
    emulation = contextlib.nullcontext()
    if cpu:  # the interpreter's patches (its module imports the interpreter)
        from tests.h200_arith import h200_arithmetic

        emulation = h200_arithmetic()
    lines = []
    with emulation as counts:
        for r in trials:
            spec = SequenceSpec.from_dict(r["spec"])
            line = dict(trial=r["trial"], seed=r["seed"], hunt_output=r["output_error"],
                        hunt_state=r.get("state_error"), bf16_floor=None, targets={})
            if grad:
                line |= dict(hunt_grad=r["grad_error"], hunt_worst_grad=r.get("worst_grad"))
            for name, target in targets.items():
                e = evaluate(target, spec, r["seed"], grad=grad)
                line["bf16_floor"] = e["bf16_floor"]
                got = line["targets"][name] = dict(
                    status=e["status"], output=e["output_error"], state=e["state_error"],
                    nonfinite=(e["output_nonfinite"] or 0) + (e["state_nonfinite"] or 0),
                    seconds=None if e["seconds"] is None else round(e["seconds"], 4))
                if grad:
                    got |= dict(grad=e["grad_error"], worst_grad=e["worst_grad"],
                                grads={n: e[f"{n}_error"] for n in GRADIENTS},
                                nonfinite=got["nonfinite"] + (e["grad_nonfinite"] or 0))
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.json:
        args.json.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fmt = lambda v: f"{v:>12.3e}" if v is not None else f"{'-':>12}"  # noqa: E731
    field, hunted, what = ("grad", "hunt_grad", "worst gradient") if grad else (
        "output", "hunt_output", "output")
    print(f"{'trial':>6}  {'hunt':>12}" + "".join(f"  {n[-24:]:>24}" for n in targets)
          + f"  {'bf16 floor':>12}" + ("  (worst gradient: hunt, then each target)" if grad
                                       else ""))
    for x in lines:
        names = ([x["hunt_worst_grad"]] + [x["targets"][n].get("worst_grad") for n in targets]
                 if grad else [])
        print(f"{x['trial']:>6}  {fmt(x[hunted])}"
              + "".join(f"  {fmt(x['targets'][n][field]):>24}" for n in targets)
              + f"  {fmt(x['bf16_floor'])}" + (f"  {' '.join(map(str, names))}" if grad
                                                else ""))
    how = (f"emulated: {counts['tf32_products'][0]} tf32 products, "
           f"{counts['bf16_stores'][0]} bf16 conversions" if cpu else "on the GPU")
    for name in targets:
        done = [x["targets"][name] for x in lines if x["targets"][name]["status"] == "measured"]
        if done and grad:
            w = max(done, key=lambda d: d["grad"])
            print(f"{name}: worst gradient {w['grad']:.3e} ({w['worst_grad']}), output "
                  f"{max(d['output'] for d in done):.3e} over {len(done)} trials ({how}); the "
                  f"hunt's worst {max(x['hunt_grad'] for x in lines):.3e}")
        elif done:
            print(f"{name}: worst output {max(d['output'] for d in done):.3e}, state "
                  f"{max(d['state'] for d in done):.3e} over {len(done)} trials ({how}); the "
                  f"hunt's worst {max(x['hunt_output'] for x in lines):.3e}")
        else:
            print(f"{name}: no trial measured ({len(lines)} tried)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

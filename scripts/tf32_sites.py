#!/usr/bin/env python3
"""Which of the kernels' tf32 products carries a case's error: each call site made exact in
turn (every other truncated, as the H100's and H200's tensor cores truncate fp32 operands),
then truncated in turn (every other exact), in the Triton interpreter with the GPU's arithmetic
emulated (tests/h200_arith.py).

    python scripts/tf32_sites.py CASE [--set T=1024,heads=1] [--measure dbeta]
        [--target kdalab] [--recompute-fp32] [--only TEXT] [--json PATH]

CASE: a hunt folder or its worst.json (the case's spec and draw seed); ``--set`` changes spec
fields (e.g. one head of a many-head finding). ``--measure``: ``output``, ``state`` or a
gradient (``dq`` … ``dh0``; a gradient runs the backward too); the default is the hunt's own
(its worst gradient, or the output). ``--target``: a kernel ``kdalab check`` loads (e.g.
``kdalab-tf32``: the forward's state products in tf32). ``--recompute-fp32``: the backward's
recompute of stage 1 stores its operands in fp32, as it does for the wide gates. ``--only``:
sweep only the call sites whose name contains TEXT. A call site is the innermost two kernel
source lines on the stack (``_mm``'s line, then its caller's).

Prints a JSON line per measurement (``mode``: ``as_run``, every product truncated;
``all_exact``; ``exact_only``; ``truncated_only``), then the sites ranked by how far making
each exact moves the error. About 12 s a measurement at T = 1024, H = 1, K = 64 on one core;
two per site, 30-40 sites for a training case (docs/training.md "Precision")."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_set(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"KEY=VALUE,..., got {item!r}")
        try:
            out[key] = json.loads(value)  # numbers, lists, null
        except ValueError:
            out[key] = value  # a word: "bf16", "none"
    return out


def load_case(path: Path) -> dict:
    """The worst.json of a hunt folder (or the file itself): {spec, seed, worst_grad}."""
    path = path / "worst.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"no worst.json at {path}")
    try:
        case = json.loads(path.read_text(encoding="utf-8"))
        return dict(spec=dict(case["spec"]), seed=int(case["seed"]),
                    worst=case.get("worst_grad") or "output")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a hunt's worst case ({exc})") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", type=Path, metavar="CASE")
    ap.add_argument("--set", type=parse_set, default={}, help="spec fields, KEY=VALUE,...")
    ap.add_argument("--measure", default=None)
    ap.add_argument("--target", default="kdalab")
    ap.add_argument("--recompute-fp32", action="store_true")
    ap.add_argument("--only", default="", help="sweep the call sites containing this text")
    ap.add_argument("--json", type=Path, default=None, help="also write the lines here")
    args = ap.parse_args(argv)
    try:
        case = load_case(args.case)
    except ValueError as exc:
        ap.error(f"CASE: {exc}")
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from kdalab.check.tensors import GRADIENTS

    measure = args.measure or case["worst"]
    if measure not in ("output", "state", *GRADIENTS):
        ap.error(f"--measure: output, state or one of {', '.join(GRADIENTS)}; got {measure!r}")
    import h200_arith
    import pytest
    import torch

    from kdalab.hunt.evaluate import evaluate
    from kdalab.hunt.target import TargetError, resolve
    from kdalab.inputs.sequences import SequenceSpec
    from kdalab.kernels import autograd

    try:
        spec = SequenceSpec.from_dict({**case["spec"], **args.set})
    except (ValueError, TypeError) as exc:
        ap.error(f"--set: {exc}")
    grad = measure in GRADIENTS
    try:
        target = resolve(args.target, "cpu", grad=grad)
    except TargetError as exc:
        ap.error(f"--target: {exc}")
    prepare = autograd.prepare

    def prepare_fp32(*a, products=None, **kw):
        return prepare(*a, products=torch.float32, **kw)

    def run(exact=None, seen=None) -> float:
        with pytest.MonkeyPatch.context() as mp:
            h200_arith.patch(mp.setattr, "bf16_stores")
            h200_arith.patch(mp.setattr, "tf32_products", exact=exact, seen=seen)
            if args.recompute_fp32:
                mp.setattr(autograd, "prepare", prepare_fp32)
            rec = evaluate(target, spec, case["seed"], grad=grad)
        if rec["status"] != "measured":
            raise SystemExit(f"tf32_sites.py: {rec['status']}: {rec['message']}")
        return rec[f"{measure}_error"]

    lines = []

    def emit(mode, site, error):
        line = dict(mode=mode, site=site, measure=measure, error=error)
        lines.append(line)
        print(json.dumps(line), flush=True)

    seen = collections.Counter()
    emit("as_run", None, run(seen=seen))
    sites = sorted(s for s in seen if args.only in s)
    if not sites:
        ap.error(f"--only: no tf32 product's call site contains {args.only!r} "
                 f"(they are: {'; '.join(sorted(seen))})")
    emit("all_exact", None, run(exact=set(seen)))
    for s in sites:
        emit("exact_only", s, run(exact={s}))
    for s in sites:
        emit("truncated_only", s, run(exact=set(seen) - {s}))
    if args.json:
        args.json.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    base = lines[0]["error"]
    alone = {x["site"]: x["error"] for x in lines if x["mode"] == "truncated_only"}
    print(f"{measure}: {base:.4g} as run, {lines[1]['error']:.4g} with every product exact")
    print(f"{'exact alone':>12}  {'truncated alone':>15}  call site (products a run)")
    for x in sorted((x for x in lines if x["mode"] == "exact_only"),
                    key=lambda x: abs(x["error"] - base), reverse=True):
        print(f"{x['error']:>12.4g}  {alone[x['site']]:>15.4g}  {x['site']} ({seen[x['site']]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A hunt's case through kdalab's Triton kernel in the interpreter, with the GPU's tf32 products
emulated: the interpreter computes ``tl.dot(..., input_precision="tf32")`` in full fp32, so
errors that come from tf32's 10-bit operands (a fact of the H200) do not show there. This rounds
a tf32 product's fp32 operands as ``cvt.rna.tf32.f32`` does (to nearest, ties away) before the
product; ``tf32x3`` and ``ieee`` products stay exact. ``--fp32 NAMES`` stores those stage-1
operands (w, qg, kend, klo, ainv, mqk) in fp32 instead of fp16, to ask which one matters.

    TRITON_INTERPRET=1 python scripts/interp_tf32.py results/hunt/worst.json [--exact] [--fp32 kend]

On the worst case of the 10-minute hunt run with KEND in fp32 (docs/hunt.md), ``--fp32 kend``
gives 1.016e-2, the H200 measured 1.018e-2; ``--exact --fp32 kend`` (the plain interpreter)
3.45e-3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    sys.exit("interp_tf32.py: run it with TRITON_INTERPRET=1")

from triton.runtime import interpreter  # noqa: E402

import kdalab.kernels.chunk_kda as chunk_kda  # noqa: E402
from kdalab.arith import rel_rmse  # noqa: E402
from kdalab.hunt.evaluate import reference  # noqa: E402
from kdalab.hunt.files import rebuild  # noqa: E402
from kdalab.kernels import chunk_kda_fwd  # noqa: E402

OPERANDS = ("w", "qg", "kend", "klo", "ainv", "mqk")


def _rna_tf32(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32:
        return x
    bits = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def emulate_tf32() -> None:
    dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if str(input_precision).upper().endswith(".TF32"):
            a = interpreter.TensorHandle(_rna_tf32(a.data), a.dtype.scalar)
            b = interpreter.TensorHandle(_rna_tf32(b.data), b.dtype.scalar)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def operands_in_fp32(names: set[str]) -> None:
    prepare = chunk_kda.chunk_kda_prepare

    def patched(*args, operand_dtype, **kw):
        if operand_dtype != torch.float16 or not names:
            return prepare(*args, operand_dtype=operand_dtype, **kw)
        out = prepare(*args, operand_dtype=torch.float32, **kw)
        return (*[t if n in names else t.half() for n, t in zip(OPERANDS, out[:6])], out[6])

    chunk_kda.chunk_kda_prepare = patched


def relative_error(a: torch.Tensor, e: torch.Tensor) -> float:
    return float(rel_rmse(a.reshape(1, -1), e.reshape(1, -1), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("worst", help="a hunt's worst.json")
    ap.add_argument("--exact", action="store_true", help="no tf32 emulation")
    ap.add_argument("--fp32", default="", help=f"stage-1 operands kept in fp32: {OPERANDS}")
    a = ap.parse_args()
    names = {n for n in a.fp32.split(",") if n}
    if names - set(OPERANDS):
        ap.error(f"--fp32: unknown operands {sorted(names - set(OPERANDS))}")
    if not a.exact:
        emulate_tf32()
    operands_in_fp32(names)
    x = rebuild(json.loads(open(a.worst, encoding="utf-8").read()), "cpu")
    kw = {k: x[k] for k in ("scale", "initial_state", "A_log", "dt_bias", "lower_bound",
                            "cu_seqlens", "use_qk_l2norm")}
    o_ref, s_ref = reference(x)
    o, s = chunk_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                         **kw)
    print(f"tf32 {'exact' if a.exact else 'emulated'}, fp32 operands {sorted(names) or '-'}: "
          f"output error {relative_error(o, o_ref):.4g}, state {relative_error(s, s_ref):.4g}")


if __name__ == "__main__":
    main()

"""KLO's storage format (issue 43's "narrowest format the precision analysis allows"), on the CPU.

    TRITON_INTERPRET=1 python benchmarks/klo_formats_cpu.py [--cases NAME,...] [--json out.json]

KLO is KEND's rounding error (``chunk_prepare.py``): the state update adds U^T KEND + U^T KLO so
that KEND's rounding, orthogonal to the keys, does not pile up where the decay is near 1 (the
hunt's collinear ridge, docs/hunt.md). The kernel's own arithmetic runs in the Triton
interpreter: fp16 KLO (the default), KLO dropped (one rounded KEND: the deleted variant), and
``KernelConfig(klo="fp8")`` (e5m2 of KLO·2^8, ``klo_to_fp8``), with two other fp8 encodings
emulated on stage 1's KLO in torch (e5m2 unscaled, e4m3 of KLO·2^14). Error: relative RMS of the
output and the final state against the fp64 token recurrence. The format changes no other
operand (tests/test_kernels.py's twin test), so the differences are KLO's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import torch

#: the 10-minute H200 hunt's worst case (tests/test_kernels.py::test_interp_collinear_keys_...)
HUNT_SPEC = dict(T=1024, heads=1, K=64, V=64, lower_bound=-1.2704990464019452, key_clusters=1,
                 key_eps=0.0, beta_mean=11.619085767495006, beta_spread=0.22499521561177355,
                 g_mean=-13.649152395847757, g_spread=0.8232454531048621,
                 A_log=(-0.3610168699450418, -0.24517758884619234),
                 dt_bias=(1.4035146622085808, 1.4114623215351119), v_scale=1.0,
                 initial_state="bf16", state_scale=0.01, block=(0, 1024))
CASES = {  # name: (preset or None for the hunt's case, changes, seed)
    "hunt_T1024_K64": (None, {}, 116546915),
    "hunt_T4096_K128": (None, dict(T=4096, K=128, V=128, block=(0, 4096)), 116546915),
    "collinear_T4096": ("collinear", dict(key_eps=0.05), 1),
    "collinear_eps6e-4_T4096": ("collinear", dict(key_eps=6e-4), 1),
    "weak_decay_correlated_T4096": ("weak_decay_correlated", {}, 1),
    "model_like_T4096": ("model_like", dict(lower_bound=-5.0), 1),
}
#: formats: the kernel's (config.klo), or stage 1's fp16 KLO re-encoded in torch
FORMATS = ("fp16", "none", "fp8", "e5m2_unscaled", "e4m3_x2^14")


def _reencode(klo, fmt):
    if fmt == "none":
        return torch.zeros_like(klo)
    x = klo.float()
    if fmt == "e5m2_unscaled":
        return x.to(torch.float8_e5m2).float().to(klo.dtype)
    return ((x * 2.0 ** 14).to(torch.float8_e4m3fn).float() / 2.0 ** 14).to(klo.dtype)


def run_case(name):
    from kdalab.arith.error import rel_rmse
    from kdalab.hunt.evaluate import reference
    from kdalab.inputs.sequences import SequenceSpec, draw, preset
    from kdalab.kernels import KernelConfig, api, chunk_kda_fwd

    base, changes, seed = CASES[name]
    if base is None:
        spec = replace(SequenceSpec(**HUNT_SPEC), **changes)
    else:
        spec = preset(base, T=4096, heads=2, K=128, V=128, initial_state="fp32", **changes)
    x = draw(spec, seed, "cpu")
    o_ref, s_ref = reference(x)
    err = lambda a, b: float(rel_rmse(a, b, a.dim()))  # noqa: E731
    row = dict(case=name, T=spec.T, K=spec.K, floor=err(o_ref.bfloat16(), o_ref))
    kw = {n: x[n] for n in ("scale", "initial_state", "A_log", "dt_bias", "lower_bound",
                            "use_qk_l2norm")}
    original = api.chunk_kda_prepare
    for fmt in FORMATS:
        t0 = time.perf_counter()
        if fmt not in ("fp16", "fp8"):
            def prepare(*a, _fmt=fmt, **k):
                ops = original(*a, **k)
                return ops[:3] + (_reencode(ops[3], _fmt),) + ops[4:]
            api.chunk_kda_prepare = prepare
        try:
            o, s = chunk_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw,
                                 output_final_state=True,
                                 config=KernelConfig(klo="fp8" if fmt == "fp8" else "fp16"))
        finally:
            api.chunk_kda_prepare = original
        row[fmt] = dict(o=err(o, o_ref), state=err(s, s_ref))
        print(f"{name:28s} {fmt:14s} o {row[fmt]['o']:.3e}  state {row[fmt]['state']:.3e}"
              f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit("klo_formats_cpu.py: run it under TRITON_INTERPRET=1 (the kernels on the CPU)")
    names = [n for n in args.cases.split(",") if n]
    bad = [n for n in names if n not in CASES]
    if bad:
        sys.exit(f"klo_formats_cpu.py: unknown --cases {bad}; one of {', '.join(CASES)}")
    rows = [run_case(n) for n in names]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()

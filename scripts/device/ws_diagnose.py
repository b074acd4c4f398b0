#!/usr/bin/env python3
"""The Gluon stage 2 (kernels/chunk_recurrent_ws.py) against the Triton kernel on a ladder of
cases, smallest first, so that one device call says where they part, not only that they do.

    python scripts/device/ws_diagnose.py [--json out.json] [--first N]

Each rung runs chunk_kda_fwd with KernelConfig(stage2="gluon") and with the Triton kernel in the
same launch form (BV 64, 4 warps, the guard's redo in a second launch) on the same inputs and
prints: bit-equal or not, the largest difference of o and of the final state, and for o the
first (token, head, value column) that differs and the chunk it lies in. Rungs: one chunk without
and with a state; 2, 3 and 4 chunks (the ring wraps at 3); K 64; a short last chunk; varlen;
checkpoints; the pool; the split passes. A rung that raises is reported and the ladder goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from kdalab.kernels import KernelConfig, chunk_kda_fwd  # noqa: E402

TRITON = dict(dot="fp16", block_v=64, num_warps=4, fp16_guard="launch")


def _inputs(B, T, H, K, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = (r(B, T, H, K).bfloat16().cuda() for _ in range(3))
    g = (r(B, T, H, K) - 2).bfloat16().cuda()
    beta = r(B, T, H).bfloat16().cuda()
    return (q, k, v, g, beta), dict(A_log=torch.zeros(H, device="cuda"),
                                    dt_bias=torch.zeros(H * K, device="cuda"))


def _first_diff(a, b):
    bad = (a.float() != b.float()).nonzero()
    if len(bad) == 0:
        return None
    idx = [int(x) for x in bad[0]]
    return dict(index=idx, chunk=idx[1] // 16, n_differ=int(len(bad)), of=a.numel())


def rung(name, B, T, H, K, *, h0=False, cu=None, ck=False, pool=False, seg=0):
    x, gate = _inputs(B, T, H, K)
    n = B if cu is None else len(cu) - 1
    kw = dict(gate, cu_seqlens=None if cu is None else torch.tensor(cu, device="cuda"))
    if pool:
        p = torch.randn(n + 2, H, K, K, device="cuda")
        kw.update(state_pool=p, state_indices=torch.arange(n, device="cuda").flip(0).int())
    else:
        kw.update(output_final_state=True,
                  initial_state=torch.randn(n, H, K, K, device="cuda") if h0 else None)
    if ck:
        kw["checkpoint_every"] = 64
    out = []
    for stage2 in ("gluon", "triton"):
        args = dict(kw)
        if pool:
            args["state_pool"] = kw["state_pool"].clone()
        res = chunk_kda_fwd(*x, **args, config=KernelConfig(**TRITON, segment_chunks=seg,
                                                            stage2=stage2))
        res = list(res) if isinstance(res, tuple) else [res]
        if pool:
            res[1] = args["state_pool"]
        out.append(res)
    torch.cuda.synchronize()
    row = dict(rung=name)
    for i, (a, b) in enumerate(zip(*out, strict=True)):
        label = ("o", "state", "checkpoints")[i]
        if a is None or b is None:
            continue
        row[f"{label}_equal"] = bool(torch.equal(a, b))
        row[f"{label}_max_diff"] = float((a.float() - b.float()).abs().max()) if a.numel() else 0
        row[f"{label}_finite"] = bool(torch.isfinite(a.float()).all())
        if label == "o":
            row["o_first_diff"] = _first_diff(a, b)
    return row


LADDER = [
    ("1 chunk", dict(B=1, T=16, H=1, K=128)),
    ("1 chunk, state", dict(B=1, T=16, H=1, K=128, h0=True)),
    ("2 chunks, state", dict(B=1, T=32, H=1, K=128, h0=True)),
    ("3 chunks (the ring's depth)", dict(B=1, T=48, H=1, K=128, h0=True)),
    ("4 chunks (the ring wraps)", dict(B=1, T=64, H=1, K=128, h0=True)),
    ("K 64", dict(B=1, T=64, H=1, K=64, h0=True)),
    ("2 heads, 2 sequences", dict(B=2, T=256, H=2, K=128, h0=True)),
    ("short last chunk", dict(B=2, T=40, H=2, K=128, h0=True)),
    ("varlen", dict(B=1, T=300, H=2, K=128, h0=True, cu=[0, 17, 17, 160, 300])),
    ("checkpoints", dict(B=1, T=300, H=2, K=128, cu=[0, 200, 300], ck=True, pool=True)),
    ("split passes", dict(B=1, T=2048, H=2, K=128, h0=True, seg=32)),
    ("long, many heads", dict(B=1, T=4096, H=32, K=128)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--first", type=int, default=len(LADDER),
                    help="the first N rungs only (small cases, e.g. under compute-sanitizer)")
    args = ap.parse_args()
    rows = []
    for name, spec in LADDER[:args.first]:
        try:
            row = rung(name, **spec)
        except Exception as exc:  # noqa: BLE001 - report and go on down the ladder
            row = dict(rung=name, error=f"{type(exc).__name__}: {exc}"[:400])
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    ok = all(r.get("o_equal") and r.get("state_equal", True) for r in rows)
    print("ws_diagnose:", "every rung bit-equal" if ok else "some rung differs or failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

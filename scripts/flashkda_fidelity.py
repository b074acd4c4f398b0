#!/usr/bin/env python3
"""How closely kdalab's FlashKDA recipes reproduce FlashKDA's own outputs on the H200, case by
case and stage by stage (CPU only; reads what scripts/device/flashkda_golden.py wrote).

    python scripts/flashkda_fidelity.py DIR [--cases a,b] [--recipe flashkda-h200]

``DIR`` holds ``flashkda_golden.npz`` and, for the stage-1 rows, ``flashkda_stage1.npz``. Set
``KDALAB_SM90_DATA=DIR`` to model the instructions from that run's sweep files. Prints, per case,
the fraction of equal bits and of equal values of the output and the final state (kernel vs
``--recipe``, torch reference vs ``flashkda``), and the same for the kernel's stage-1 workspace
(k·2^G, q·2^G·scale, k·2^(G_C−G), 2^G_C, INV, Mqk on the tiles' valid rows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.flashkda_data import load_golden  # noqa: E402

from kdalab.arith import FP32, quantize  # noqa: E402
from kdalab.kda import forward, get_recipe  # noqa: E402
from kdalab.kda.chunk import _intra, prepare_for_recipe  # noqa: E402
from kdalab.kda.tiles import decay_factor, get_tiles, operand  # noqa: E402

C = 16


def agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(equal bits, equal values) of two tensors of one dtype."""
    itype = {2: torch.int16, 4: torch.int32}[a.element_size()]
    x = (a.contiguous().view(itype) ^ b.contiguous().view(itype)).to(torch.int64)
    width = 8 * a.element_size()
    x = x & ((1 << width) - 1)
    diff = sum(int(((x >> i) & 1).sum()) for i in range(width))
    return 1 - diff / max(x.numel() * width, 1), float((x == 0).double().mean())


def call(case, recipe):
    return forward(case["q"], case["k"], case["v"], case["g"], case["beta"],
                   scale=case.meta["scale"], A_log=case["A_log"], dt_bias=case["dt_bias"],
                   lower_bound=case.meta["lower_bound"], initial_state=case.get("initial_state"),
                   output_final_state=True, cu_seqlens=case.get("cu_seqlens"),
                   state_layout="VK", chunk_size=C, tiles="chunk_start", inverse="neumann",
                   recipe=recipe)


def stage1(case, recipe):
    """kdalab's stage-1 intermediates per tile, in the workspace's layout [H, tiles, ...], and a
    mask of each tile's valid rows [tiles, 16]."""
    r = get_recipe(recipe)
    tiles = get_tiles("chunk_start")
    p = prepare_for_recipe(case["q"], case["k"], case["v"], case["g"], case["beta"], recipe=r,
                           scale=case.meta["scale"], A_log=case["A_log"],
                           dt_bias=case["dt_bias"], lower_bound=case.meta["lower_bound"],
                           cu_seqlens=case.get("cu_seqlens"), state_layout="VK")
    n, hv, t, kd = p.q.shape
    nc = -(-t // C)
    pad = nc * C - t

    def chunks(x):
        if pad:
            x = torch.cat([x, x.new_zeros(x.shape[:2] + (pad,) + x.shape[3:])], dim=2)
        return x.reshape(n, hv, nc, C, *x.shape[3:])

    qc, kc = chunks(p.q), chunks(p.k)
    g = r.scalar_ops.cumsum_along(chunks(p.log_decay.float()), -2)
    bc = chunks(p.beta.float().unsqueeze(-1))[..., 0]
    scale_t = torch.tensor(p.scale, dtype=torch.float64)
    mqk, inv = _intra(qc, kc, g, bc, scale_t, tiles, "neumann", r)
    op = r.operand_format
    gamma = decay_factor(g, r)
    out = {"qd": operand(operand(qc, gamma, op), quantize(scale_t, op), op),
           "kd": operand(kc, gamma, op)}
    k_inv = operand(kc, decay_factor(-g, r), op)
    out["kr"] = operand(k_inv, decay_factor(g[..., -1:, :], r), op)
    out["gt"] = decay_factor(g[..., -1, :], r, FP32)
    out["inv"], out["mqk"] = inv, mqk
    used, rows = [], []
    for i, length in enumerate(p.lengths):
        for c in range(-(-length // C)):
            used.append((i, c))
            rows.append(torch.arange(C) < length - c * C)
    res = {k: torch.stack([v[i, :, c] for i, c in used], dim=1) for k, v in out.items()}
    return res, torch.stack(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--cases", default="")
    ap.add_argument("--recipe", default="flashkda-h200")
    args = ap.parse_args(argv)
    golden = args.dir / "flashkda_golden.npz"
    if not golden.exists():
        print(f"{golden}: no such file", file=sys.stderr)
        return 2
    facts, cases = load_golden(golden)
    want = {c for c in args.cases.split(",") if c}
    s1 = args.dir / "flashkda_stage1.npz"
    ws = np.load(s1) if s1.exists() else None
    print(f"golden: {facts['device']}, {facts['date_utc']}; recipe {args.recipe}")
    from kdalab.arith import sm90
    print("instructions:", sm90.measured())
    for case in cases:
        if want and case.name not in want:
            continue
        o, s = call(case, args.recipe)
        ko = agreement(o, case["out_kernel"])
        ks = agreement(s.to(case["final_kernel"].dtype), case["final_kernel"])
        o2, s2 = call(case, "flashkda")  # the reference's outputs, where kept (else = kernel's)
        ref_o = case.get("out_ref") if case.get("out_ref") is not None else case["out_kernel"]
        ref_s = case.get("final_ref") if case.get("final_ref") is not None else \
            case["final_kernel"]
        ro = agreement(o2, ref_o)
        rs = agreement(s2.to(ref_s.dtype), ref_s)
        line = (f"{case.name:30s} kernel o {ko[0]:.5f}/{ko[1]:.4f} S {ks[0]:.5f}/{ks[1]:.4f}"
                f" | ref o {ro[0]:.5f}/{ro[1]:.4f} S {rs[0]:.5f}/{rs[1]:.4f}")
        if ws is not None:
            mine, valid = stage1(case, args.recipe)
            parts = []
            for name in ("kd", "qd", "kr", "gt", "inv", "mqk"):
                a = ws[f"ws__{case.meta['key']}__{name}"]
                theirs = (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
                          if a.dtype == np.uint16 else torch.from_numpy(a))
                ours = mine[name].to(theirs.dtype)
                if name in ("qd", "mqk"):  # rows past a sequence's end are not computed alike
                    m = valid.view(1, -1, C, 1).expand_as(ours)
                    ours, theirs = ours[m], theirs[m]
                parts.append(f"{name} {agreement(ours, theirs)[1]:.4f}")
            line += " | stage1 " + " ".join(parts)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

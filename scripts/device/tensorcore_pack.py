#!/usr/bin/env python3
"""Pack a compact subset of the device's characterization outputs into tests/data/tensorcore/.

    python scripts/device/tensorcore_pack.py RUN1_DIR [RUN2_DIR [RUN3_DIR]]

RUN1_DIR holds tensorcore_characterize.py's files, RUN2_DIR tensorcore_verify.py's, RUN3_DIR
benchmarks/bench_gpu_sweep.py's. Every array
is raw bits (uint16 for fp16/bf16, uint32 for fp32), exactly as the H200 produced them.
"""

from __future__ import annotations

import os
import sys

import numpy as np

DEST = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "tensorcore")


def take_classes(x: np.ndarray, n_classes: int, per_class: int) -> np.ndarray:
    t = x.shape[0] // n_classes
    idx = np.concatenate([np.arange(i * t, i * t + per_class) for i in range(n_classes)])
    return x[idx]


def pack_run1(src: str) -> None:
    fi = np.load(os.path.join(src, "f16_in.npz"))
    fo = np.load(os.path.join(src, "f16_out.npz"))
    names = fi["names"]
    nc = len(names)
    per = 50  # 8 classes x 50 tiles x 256 outputs = 102,400 dot products per engine
    # cuBLAS batched, mma.sync and Triton gave the same bits on every tile (checked on the
    # device, all 4,000): one copy is kept, as "cublas".
    assert all(np.array_equal(fo["mma"], fo[k]) for k in ("cublas", "triton"))
    np.savez_compressed(
        os.path.join(DEST, "f16_tiles.npz"), names=names,
        **{k: take_classes(fi[k], nc, per) for k in ("a", "b", "c")},
        mma_c=take_classes(fo["mma_c"], nc, per), cublas=take_classes(fo["cublas"], nc, per),
        mma_f32_c=take_classes(fo["mma_f32_c"], nc, per))
    bd = np.load(os.path.join(src, "bf16.npz"))
    nb = len(bd["names"])
    per = 32
    np.savez_compressed(
        os.path.join(DEST, "bf16_tiles.npz"), names=bd["names"],
        **{k: take_classes(bd[k], nb, per) for k in ("a", "b", "c", "mma_c", "mma")})
    sh = np.load(os.path.join(src, "f16_shapes.npz"))
    out = {}
    for c in (8, 16, 17, 18, 19, 24, 32, 48):
        n = sh[f"a{c}"].shape[0] // 2
        idx = np.r_[0:6, n:n + 6]  # 6 normal, 6 wide-exponent matrices
        for k in ("a", "b", "single", "batched"):
            out[f"{k}{c}"] = sh[f"{k}{c}"][idx]
    np.savez_compressed(os.path.join(DEST, "gemm_shapes.npz"), **out)
    sd = np.load(os.path.join(src, "seed_l32.npz"))
    # the L operands are recomputed in the tests (make_inputs, kernel scales): L32 and INV kept
    keep = {k: sd[k] for k in sd.files if k.split("|")[0] in ("l32", "inv")}
    for c in (8, 16, 17, 18, 19, 24, 32, 48):
        for k in ("rx", "ry", "rl32"):
            keep[f"{k}|{c}"] = sd[f"{k}|{c}"][:3]
    np.savez_compressed(os.path.join(DEST, "seed_runs_h200.npz"), **keep)
    pr = np.load(os.path.join(src, "sgemm_probes.npz"))
    np.savez_compressed(os.path.join(DEST, "sgemm_probes.npz"), i=pr["i"], j=pr["j"],
                        r16=pr["r16"], r48=pr["r48"])


def pack_run2(src: str) -> None:
    for name in ("adversarial.npz", "shapes.npz", "sgemm.npz"):
        path = os.path.join(src, name)
        if not os.path.exists(path):
            continue
        d = np.load(path)
        keep = dict(d)
        if name == "adversarial.npz":  # 16 of the 64 tiles per set
            keep = {k: (v[:16] if v.ndim == 3 else v) for k, v in keep.items()}
        if name == "shapes.npz":  # 8 of the 128 matrices per shape (4 normal, 4 wide)
            keep = {k: (v[np.r_[0:4, 64:68]] if v.ndim == 3 else v) for k, v in keep.items()}
        if name == "sgemm.npz":
            keep = {k: v[:4] for k, v in keep.items()}
        np.savez_compressed(os.path.join(DEST, "v2_" + name), **keep)


def pack_sweep_bits(src: str) -> None:
    """The batched GPU sweep's L and INV bits: 8 seeds of each seed-table configuration
    (v4: recorded 2026-11-29, session 2, with the non-flushing fp32 L kernel)."""
    d = np.load(os.path.join(src, "gpu_sweep_bits.npz"))
    keep = {}
    for k in d.files:
        if k.endswith("|seeds") or k.endswith("|l") or k.endswith("|inv"):
            keep[k] = d[k][:8]
    np.savez_compressed(os.path.join(DEST, "v4_gpu_sweep_bits.npz"), **keep)


if __name__ == "__main__":
    os.makedirs(DEST, exist_ok=True)
    pack_run1(sys.argv[1])
    if len(sys.argv) > 2:
        pack_run2(sys.argv[2])
    if len(sys.argv) > 3:
        pack_sweep_bits(sys.argv[3])
    total = sum(os.path.getsize(os.path.join(DEST, f)) for f in os.listdir(DEST))
    print(f"{DEST}: {total / 1e6:.2f} MB")

"""Does stage 1's Neumann inverse lose accuracy with 3xTF32 products (its products since ba6b0fd)
instead of fp32 FMA products (the earlier ones)? A CPU check in numpy on 16 x 16 blocks like
stage 1's: near-collinear unit keys (spread 0 to 1), decays from weak to the bound's, beta from
sigmoid(-2) to sigmoid(12). 3xTF32 is emulated as tf32(a)·tf32(b) + tf32(a)·tf32(b - tf32(b)) +
tf32(a - tf32(a))·tf32(b), exact products summed in fp32 (the tensor cores' accumulation order
differs; the size of the error does not). Prints the worst relative error (Frobenius) of each
against the fp64 inverse of the same fp32 L.

    python scripts/inverse_tf32x3.py [--trials 300]
"""

import argparse

import numpy as np


def tf32(x):
    """fp32 rounded to tf32's 10-bit significand (to nearest even)."""
    i = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
    return ((i + 0xFFF + ((i >> 13) & 1)) & ~0x1FFF).astype(np.int32).view(np.float32)


def dot_tf32x3(a, b):
    ab, bb = tf32(a), tf32(b)
    a_lo, b_lo = tf32(a - ab), tf32(b - bb)

    def exact(x, y):
        return (x.astype(np.float64) @ y.astype(np.float64)).astype(np.float32)
    return exact(ab, b_lo) + exact(a_lo, bb) + exact(ab, bb)


def dot_fp32(a, b):
    return a @ b


def neumann(L, dot):
    """(I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8), as chunk_prepare.neumann_inverse16."""
    p, inv = L, np.eye(16, dtype=np.float32) - L
    for _ in range(3):
        p = dot(p, p)
        inv = (inv + dot(inv, p)).astype(np.float32)
    return inv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    worst = {"fp32 FMA": 0.0, "3xTF32": 0.0}
    for trial in range(args.trials):
        spread = (0.0, 1e-3, 1e-2, 0.1, 1.0)[trial % 5]
        k = rng.standard_normal((1, 128)) + spread * rng.standard_normal((16, 128))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        g = -rng.uniform(0, (0.01, 0.5, 5.0)[trial % 3], (16, 128)).cumsum(0)
        beta = 1 / (1 + np.exp(-rng.uniform(-2, 12, 16)))
        L = (np.tril((k * np.exp(g)) @ (k * np.exp(-g)).T, -1) * beta[:, None]).astype(np.float32)
        exact = np.linalg.inv(np.eye(16) + L.astype(np.float64))
        for name, dot in (("fp32 FMA", dot_fp32), ("3xTF32", dot_tf32x3)):
            err = np.linalg.norm(neumann(L, dot) - exact) / np.linalg.norm(exact)
            worst[name] = max(worst[name], float(err))
    for name, err in worst.items():
        print(f"{name:<9} worst relative error of the inverse: {err:.3e}")


if __name__ == "__main__":
    main()

"""What bench_train's accuracy rows and the pages built from them share, without torch (so
that ``collect_candidates.py`` reads bench_train's raw JSON as bench_train itself does):
the leaves a training step differentiates and the worst kdalab gradient of a row."""

from __future__ import annotations

#: the inputs whose gradients bench_train measures, in its rows' order (``kdalab_d<leaf>``)
LEAVES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "h0")


def grad_names(row: dict, kernel: str = "kdalab") -> list[str]:
    """The leaves whose ``<kernel>_d<leaf>`` error an accuracy row holds, in LEAVES' order."""
    return [n for n in LEAVES if f"{kernel}_d{n}" in row]


def worst_leaf(row: dict) -> str | None:
    """The leaf whose kdalab gradient is an accuracy row's worst (``q``, ...), None if it has
    none."""
    names = grad_names(row)
    return max(names, key=lambda n: row[f"kdalab_d{n}"]) if names else None


def worst_grad(row: dict) -> str | None:
    """The name of an accuracy row's worst kdalab gradient (``dq``, ...), None if it has none."""
    leaf = worst_leaf(row)
    return None if leaf is None else f"d{leaf}"

"""Summation orders of an fp16 GEMM built from Tensor-Core blocks (:func:`tc_block`): the
candidates that cuBLAS's per-shape kernels are compared with (``benchmarks/cublas_shapes.py``;
docs/tensor-cores.md).

An :class:`Order` says how K is cut into blocks, which blocks share a partial sum, how the blocks
of one partial sum are joined (chained through the accumulator, or as slices each rounded on its
own and then added) and how the partial sums are combined. The H200 models of
:mod:`kdalab.arith.tensorcore` are some of them: ``h200-mma`` is ``mma-k16-chain`` and ``h200``'s
``split`` rule (K > 16, m or n > 16, K < 128) is ``slices8-seq``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdalab.arith.formats import FP16, FP32, Format
from kdalab.arith.tensorcore import _fp16_add, tc_block

__all__ = ["Order", "ORDERS", "ordered_gemm"]


@dataclass(frozen=True)
class Order:
    """An fp16 GEMM's summation order, built from Tensor-Core blocks of ``block`` products.

    The K blocks are assigned to partial sums (``assign``): ``one`` (all to one),
    ``split`` (``count`` contiguous parts), ``size`` (parts of ``count`` products),
    ``interleave`` (block i to part i mod ``count``). Inside a part the blocks are chained
    (``inner="chain"``: each block's accumulator c is the previous block's result) or summed as
    slices (``"slices"``: each block with c = 0, rounded, the slices added left to right). The parts
    are combined ``seq`` (left to right), ``tree`` (pairwise) or ``f32`` (summed in float32,
    rounded once). ``acc``: the accumulator's format (fp32: rounded to fp16 at the end)."""

    name: str
    block: int = 16
    inner: str = "chain"
    assign: str = "one"
    count: int = 1
    combine: str = "seq"
    acc: Format = FP16

    def groups(self, k: int) -> list[list[tuple[int, int]]]:
        blocks = [(k0, min(k0 + self.block, k)) for k0 in range(0, k, self.block)]
        n = len(blocks)
        if self.assign == "one":
            return [blocks]
        if self.assign == "split":
            per = -(-n // self.count)
            return [blocks[i:i + per] for i in range(0, n, per)]
        if self.assign == "size":
            per = max(1, self.count // self.block)
            return [blocks[i:i + per] for i in range(0, n, per)]
        if self.assign == "interleave":
            return [g for g in (blocks[i::self.count] for i in range(self.count)) if g]
        raise ValueError(f"unknown assign {self.assign!r}")

    def key(self, k: int) -> tuple:
        """Orders with equal keys compute the same bits at this k (computed once)."""
        groups = self.groups(k)
        if self.inner == "slices" and self.combine == "seq":
            groups = [[blk] for g in groups for blk in g]
        inner = self.inner if any(len(g) > 1 for g in groups) else "-"
        # two parts: one correctly rounded add however they are combined
        combine = self.combine if len(groups) > 2 else "-"
        return (tuple(map(tuple, groups)), inner, combine, self.acc.name)


ORDERS = (
    Order("mma-k16-chain"),
    Order("mma-k8-chain", block=8),
    Order("mma-k4-chain", block=4),
    Order("slices4-seq", block=4, inner="slices"),
    Order("slices4-tree", block=4, inner="slices", assign="size", count=4, combine="tree"),
    Order("slices8-seq", block=8, inner="slices"),
    Order("slices8-tree", block=8, inner="slices", assign="size", count=8, combine="tree"),
    Order("slices8-f32", block=8, inner="slices", assign="size", count=8, combine="f32"),
    Order("slices16-seq", inner="slices"),
    Order("slices16-tree", assign="size", count=16, combine="tree"),
    Order("parts32-k16", assign="size", count=32),
    Order("parts64-k16", assign="size", count=64),
    Order("parts32-k8", block=8, assign="size", count=32),
    Order("parts16-slices8-tree", block=8, inner="slices", assign="size", count=16,
          combine="tree"),
    Order("splitk2-k16", assign="split", count=2),
    Order("splitk2-slices8", block=8, inner="slices", assign="split", count=2),
    Order("splitk4-k16", assign="split", count=4),
    Order("splitk4-k16-tree", assign="split", count=4, combine="tree"),
    Order("interleave2-k16", assign="interleave", count=2),
    Order("interleave4-k16", assign="interleave", count=4),
    Order("interleave4-k16-tree", assign="interleave", count=4, combine="tree"),
    Order("interleave2-k8", block=8, assign="interleave", count=2),
    Order("f32acc-k16-chain", acc=FP32),
    Order("f32acc-slices8", block=8, inner="slices", acc=FP32),
)


def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y in x's format: fp16 correctly rounded (:func:`_fp16_add`), float32 IEEE."""
    return _fp16_add(x, y) if x.dtype == torch.float16 else x + y


def _combine(parts: list[torch.Tensor], how: str) -> torch.Tensor:
    if how == "f32":
        total = parts[0].float()
        for p in parts[1:]:
            total = total + p.float()
        return total
    while len(parts) > 1:
        if how == "seq":
            parts = [_add(parts[0], parts[1])] + parts[2:]
        else:  # tree: neighbours pairwise, an odd last one carried up
            parts = [_add(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
    return parts[0]


def ordered_gemm(a: torch.Tensor, b: torch.Tensor, order: Order) -> torch.Tensor:
    """``a @ b`` (fp16 values, [..., M, K] and [..., K, N]) in ``order``; fp16 out."""
    a, b = a.double(), b.double()
    parts = []
    for group in order.groups(a.shape[-1]):
        acc = None
        for k0, k1 in group:
            c = None if order.inner == "slices" or acc is None else acc.double()
            r = tc_block(a[..., k0:k1], b[..., k0:k1, :], c, FP16, order.acc)
            acc = r if order.inner == "chain" or acc is None else _add(acc, r)
        parts.append(acc)
    return _combine(parts, order.combine).half()

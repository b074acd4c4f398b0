"""The one configuration of the kernels: prefill, decode and backward take the same
:class:`KernelConfig`. Every field is a choice that changes speed or precision path, never the
function computed; ``None`` means "chosen from the problem" (``launch_plan.py`` for the
prefill, ``decode.decode_launch_shape`` for decode)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelConfig", "DEFAULT_CONFIG", "DOT_PRECISION"]

_DOTS = ("auto", "fp16", "tf32", "fp32")
_GUARDS = ("auto", "inline", "launch")
_STAGE2 = ("auto", "triton", "gluon")
#: the precision of a resolved ``dot``'s products of fp32 operands (``tl.dot``'s
#: ``input_precision``; fp16 operands ignore it): the one place "fp32" means 3xTF32
DOT_PRECISION = {"fp16": "tf32", "tf32": "tf32", "fp32": "tf32x3"}


@dataclass(frozen=True)
class KernelConfig:
    """Kernel choices.

    ``dot``: the recurrent products' operands — ``"fp16"`` (S and U rounded to fp16, fp32
    accumulation; only with L2-normalized q and k, and guarded: a program whose state leaves
    fp16's range recomputes from the chunk where it left, with tf32 products), ``"tf32"``,
    ``"fp32"`` (every product of every stage, forward and backward, in 3xTF32 on fp32
    operands stored in fp32, nothing rounded to 10 bits: about fp32's precision, for training
    where the gradients' accuracy matters more than speed; docs/training.md "The fp32 path"),
    or ``"auto"`` (fp16 where allowed, else tf32).
    ``block_v``, ``num_warps``: a recurrent (or decode) program's value columns and warps;
    ``prepare_warps``: stage 1's warps; ``segment_chunks``: the sequence-parallel state pass's
    segment length in 16-token chunks (0: a serial pass per sequence).
    ``fp16_guard``: where the fp16 guard's redo runs — ``"inline"`` (in the same launch; its
    code costs registers), ``"launch"`` (a second launch of only the programs the first
    flagged) or ``"auto"`` (``launch_plan.fp16_guard``). Both give the same bits.
    ``stage2``: the recurrent passes by the Triton kernel (``"triton"``), by the
    warp-specialized Gluon kernel (``"gluon"``, ``chunk_recurrent_ws.py``: fp16 products,
    K 64 or 128, V a multiple of 64, on a Hopper GPU; elsewhere Triton's), or ``"auto"``
    (the launch plan's choice: ``launch_plan.GLUON_COST``). On the same plan both give the
    same bits; the plan's segment length can differ with the kernel.
    """

    dot: str = "auto"
    block_v: int | None = None
    num_warps: int | None = None
    prepare_warps: int | None = None
    segment_chunks: int | None = None
    fp16_guard: str = "auto"
    stage2: str = "auto"

    def __post_init__(self):
        if self.dot not in _DOTS:
            raise ValueError(f"config.dot must be one of {_DOTS}, got {self.dot!r}")
        checks = (("block_v", (16, 32, 64, 128)), ("num_warps", (1, 2, 4, 8, 16)),
                  ("prepare_warps", (1, 2, 4, 8, 16)))
        for name, allowed in checks:
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"config.{name} must be one of {allowed} or None, "
                                 f"got {value!r}")
        if self.fp16_guard not in _GUARDS:
            raise ValueError(f"config.fp16_guard must be one of {_GUARDS}, "
                             f"got {self.fp16_guard!r}")
        if self.stage2 not in _STAGE2:
            raise ValueError(f"config.stage2 must be one of {_STAGE2}, got {self.stage2!r}")
        s = self.segment_chunks
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise ValueError(f"config.segment_chunks must be a chunk count >= 0 or None, "
                             f"got {s!r}")


DEFAULT_CONFIG = KernelConfig()

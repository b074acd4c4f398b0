"""Triton kernels: the chunked KDA forward on the lower-bound scheme (chunk 16), decode on a
state pool, and both as torch custom ops (``torch.ops.kdalab.*``, registered on import)."""

from . import ops  # noqa: F401 - registers torch.ops.kdalab.chunk_kda_fwd and .kda_decode
from .chunk_kda import (
           DEFAULT_CONFIG,
           TF32_CONFIG,
           KernelConfig,
           chunk_kda_fwd,
           chunk_kda_transition,
)
from .decode import kda_decode
from .pool import checkpoint_offsets

__all__ = ["chunk_kda_fwd", "chunk_kda_transition", "kda_decode", "checkpoint_offsets",
           "KernelConfig", "DEFAULT_CONFIG", "TF32_CONFIG"]

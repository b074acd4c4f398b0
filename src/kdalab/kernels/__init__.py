"""Triton kernels: the chunked KDA forward on the lower-bound scheme (chunk 16)."""

from .chunk_kda import (
           DEFAULT_CONFIG,
           TF32_CONFIG,
           KernelConfig,
           chunk_kda_fwd,
           chunk_kda_transition,
)

__all__ = ["chunk_kda_fwd", "chunk_kda_transition", "KernelConfig", "DEFAULT_CONFIG",
           "TF32_CONFIG"]

"""Triton kernels: the chunked KDA forward on the lower-bound scheme (chunk 16)."""

from .chunk_kda import DEFAULT_CONFIG, FAST_CONFIG, TF32_CONFIG, KernelConfig, chunk_kda_fwd

__all__ = ["chunk_kda_fwd", "KernelConfig", "DEFAULT_CONFIG", "FAST_CONFIG", "TF32_CONFIG"]

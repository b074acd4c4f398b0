"""Triton kernels: the chunked KDA forward (chunk 16) and its backward, decode on a state
pool, and the custom ops (``torch.ops.kdalab.*``, registered on import). docs/kernels.md is
the design; docs/training.md the backward's.

    chunk_kda             differentiable prefill: (o, final_state), autograd through it
    chunk_kda_fwd         the forward alone (inference, serving: pools, checkpoints)
    chunk_kda_transition  each sequence's affine state map (S_end = M S_start + R)
    kda_decode            a few tokens per sequence on a state pool, in place
    KernelConfig          the one configuration of all of them
"""

try:
    import triton  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kdalab.kernels needs Triton (and a CUDA GPU, or TRITON_INTERPRET=1 on the CPU): "
        "pip install 'kdalab[kernels]'") from exc

from . import ops  # noqa: F401, E402 - registers torch.ops.kdalab.*
from .api import chunk_kda_fwd, chunk_kda_transition  # noqa: E402
from .autograd import chunk_kda  # noqa: E402 - registers torch.ops.kdalab.chunk_kda(_bwd)
from .config import DEFAULT_CONFIG, KernelConfig  # noqa: E402
from .decode import kda_decode  # noqa: E402
from .pool import checkpoint_offsets  # noqa: E402

__all__ = ["chunk_kda", "chunk_kda_fwd", "chunk_kda_transition", "kda_decode", "checkpoint_offsets",
           "KernelConfig", "DEFAULT_CONFIG"]

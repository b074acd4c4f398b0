"""Every input kdalab draws: the seed's chunk-level families, the sequence-level generator and its
named presets. Studies, check, hunt, the benchmarks and the golden scripts all draw from here.

The sequence level (:mod:`kdalab.inputs.sequences`): one parametrized generator of KDA forward
inputs, :class:`SequenceSpec` (its knobs) and :func:`draw` (a spec and a seed -> chunk_kda_fwd's
keyword arguments, the same bits on every device), with the named families as values:
``model_like``, ``saturated``, ``weak_decay_correlated``, ``long`` and ``collinear``
(:data:`PRESETS`, :func:`preset`).
"""

from kdalab.inputs.sequences import PRESETS, SequenceSpec, draw, kda_kwargs, preset

__all__ = ["SequenceSpec", "draw", "kda_kwargs", "PRESETS", "preset"]

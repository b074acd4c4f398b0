"""Replay of captured inputs: cases read from safetensors files instead of drawn.

A file holds one call's inputs, tensors named as ``chunk_kda_fwd``'s arguments: ``q, k, g [B, T,
H, K]``, ``v [B, T, H, V]``, ``beta [B, T, H]`` (logits), ``A_log [H]``, ``dt_bias [H, K]`` (or
``[H*K]``), and optionally ``initial_state [N, H, K, V]`` and ``cu_seqlens [N + 1]``; metadata
strings ``gate`` (the gate mode, :data:`kdalab.kda.GATES`; a file without it holds the
lower-bound gate), ``lower_bound`` (``none`` or absent for the unbounded gate, and for a
log-decay without a promise) and ``scale`` (default ``K ** -0.5``); a ``log_decay`` file holds no
``A_log`` or ``dt_bias``; and optionally ``seed`` (the case's seed: ``--grad`` draws the
upstream gradients from it; a hunt's worst case carries its draw's, so that ``check --grad
--inputs`` replays the hunt's gradients). :mod:`kdalab.check.capture` writes such files from a
model's real activations.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kdalab.check.cases import Case
from kdalab.check.tensors import OPTIONAL, REQUIRED, REQUIRED_LOG_DECAY, read_inputs

__all__ = ["REQUIRED", "OPTIONAL", "read_inputs", "replay_cases", "write_inputs",
           "gate_metadata"]

def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"--inputs: no .safetensors files in {str(path)!r}")
        return files
    if not path.is_file():
        raise ValueError(f"--inputs: no such file or folder {str(path)!r}")
    return [path]


def replay_cases(path: str | Path) -> tuple[Case, ...]:
    """One accuracy case per file of ``path`` (a file, or a folder of ``*.safetensors``), named
    ``inputs/<file name>``."""
    out = []
    for file in _files(Path(path).expanduser()):
        x = read_inputs(file)
        b, n_t, h, kd = x.q.shape
        seqlens = None if x.cu_seqlens is None else tuple(x.cu_seqlens.diff().tolist())
        state = ("none" if x.initial_state is None
                 else "bf16" if x.initial_state.dtype == torch.bfloat16 else "fp32")
        name = "inputs/" + "".join(c if c.isalnum() or c in "._-" else "_" for c in file.stem)
        g_dtype = "fp32" if x.g.dtype == torch.float32 else "bf16"
        out.append(Case(name, T=n_t, batch=b, seqlens=seqlens, heads=h, K=kd, V=x.v.shape[-1],
                        gate=x.gate, lower_bound=x.lower_bound, g_dtype=g_dtype,
                        initial_state=state, source=str(file.resolve()), seed=_seed(file),
                        about=f"captured inputs from {file.name}"))
    return tuple(out)


def _seed(file: Path) -> int:
    """The file's ``seed`` metadata (an integer >= 0), else 0."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as fh:
        text = (fh.metadata() or {}).get("seed", "0")
    if not text.isdigit():
        raise ValueError(f"--inputs: {str(file)!r}: metadata 'seed' must be an integer >= 0, "
                         f"got {text!r}")
    return int(text)


def gate_metadata(gate: str, lower_bound: float | None) -> dict[str, str]:
    """A file's ``gate`` and ``lower_bound`` metadata (the module's format)."""
    return {"gate": gate, "lower_bound": "none" if lower_bound is None
            else repr(float(lower_bound))}


def write_inputs(path: str | Path, tensors: dict[str, torch.Tensor], *,
                 lower_bound: float | None, scale: float | None = None,
                 gate: str = "lower_bound") -> Path:
    """Write one call's inputs (names as :data:`REQUIRED` and :data:`OPTIONAL`; a ``log_decay``
    call's without ``A_log`` and ``dt_bias``) as a replayable safetensors file."""
    from safetensors.torch import save_file

    required = REQUIRED_LOG_DECAY if gate == "log_decay" else REQUIRED
    missing = [n for n in required if tensors.get(n) is None]
    if missing:
        raise ValueError(f"tensors: missing {', '.join(missing)}")
    keep = {n: tensors[n].detach().to("cpu").contiguous() for n in required + OPTIONAL
            if tensors.get(n) is not None}
    meta = gate_metadata(gate, lower_bound)
    if scale is not None:
        meta["scale"] = repr(float(scale))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(path), metadata=meta)
    return path

"""Replay of captured inputs: cases read from safetensors files instead of drawn.

A file holds one call's inputs, tensors named as ``chunk_kda_fwd``'s arguments: ``q, k, g [B, T,
H, K]``, ``v [B, T, H, V]``, ``beta [B, T, H]`` (logits), ``A_log [H]``, ``dt_bias [H, K]`` (or
``[H*K]``), and optionally ``initial_state [N, H, K, V]`` and ``cu_seqlens [N + 1]``; metadata
strings ``lower_bound`` and ``scale`` (default ``K ** -0.5``). :mod:`kdalab.check.capture`
writes such files from a model's real activations.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kdalab.check.cases import Case, CaseInputs

__all__ = ["REQUIRED", "OPTIONAL", "read_inputs", "replay_cases", "write_inputs"]

REQUIRED = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
OPTIONAL = ("initial_state", "cu_seqlens")


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"--inputs: no .safetensors files in {str(path)!r}")
        return files
    if not path.is_file():
        raise ValueError(f"--inputs: no such file or folder {str(path)!r}")
    return [path]


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except Exception as exc:  # not a safetensors file, or a damaged one
        raise ValueError(f"--inputs: cannot read {str(path)!r} as safetensors "
                         f"({type(exc).__name__}: {exc})") from None
    return tensors, meta


def _number(meta: dict, key: str, path: Path, default: float | None) -> float:
    if key not in meta:
        if default is None:
            raise ValueError(f"--inputs: {str(path)!r} has no {key!r} in its metadata")
        return default
    try:
        value = float(meta[key])
    except ValueError:
        raise ValueError(f"--inputs: {str(path)!r}: metadata {key!r} must be a number, got "
                         f"{meta[key]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"--inputs: {str(path)!r}: metadata {key!r} must be finite")
    return value


def read_inputs(path: str | Path) -> CaseInputs:
    """One file's inputs as a case's (every value judged)."""
    path = Path(path)
    t, meta = _load(path)
    missing = [n for n in REQUIRED if n not in t]
    if missing:
        raise ValueError(f"--inputs: {str(path)!r} lacks the tensors {', '.join(missing)} "
                         f"(expected {', '.join(REQUIRED)}; optional {', '.join(OPTIONAL)})")
    q, v = t["q"], t["v"]
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"--inputs: {str(path)!r}: q and v must be [B, T, H, K|V], got "
                         f"{tuple(q.shape)} and {tuple(v.shape)}")
    b, n_t, h, kd = q.shape
    cu = t.get("cu_seqlens")
    cu = None if cu is None else cu.to(torch.int64)
    n = b if cu is None else len(cu) - 1
    lower_bound = _number(meta, "lower_bound", path, None)
    scale = _number(meta, "scale", path, kd ** -0.5)
    return CaseInputs(q=q, k=t["k"], v=v, g=t["g"], beta=t["beta"], A_log=t["A_log"].float(),
                      dt_bias=t["dt_bias"].float().reshape(h, kd),
                      initial_state=t.get("initial_state"), cu_seqlens=cu,
                      lower_bound=lower_bound, scale=scale, use_qk_l2norm=True,
                      rows=torch.ones(b, n_t, dtype=torch.bool),
                      states=torch.ones(n, dtype=torch.bool))


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
        out.append(Case(name, T=n_t, batch=b, seqlens=seqlens, heads=h, K=kd, V=x.v.shape[-1],
                        lower_bound=x.lower_bound, initial_state=state, source=str(file.resolve()),
                        about=f"captured inputs from {file.name}"))
    return tuple(out)


def write_inputs(path: str | Path, tensors: dict[str, torch.Tensor], *, lower_bound: float,
                 scale: float | None = None) -> Path:
    """Write one call's inputs (names as :data:`REQUIRED` and :data:`OPTIONAL`) as a replayable
    safetensors file."""
    from safetensors.torch import save_file

    missing = [n for n in REQUIRED if tensors.get(n) is None]
    if missing:
        raise ValueError(f"tensors: missing {', '.join(missing)}")
    keep = {n: tensors[n].detach().to("cpu").contiguous() for n in REQUIRED + OPTIONAL
            if tensors.get(n) is not None}
    meta = {"lower_bound": repr(float(lower_bound))}
    if scale is not None:
        meta["scale"] = repr(float(scale))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(path), metadata=meta)
    return path

"""A case's tensors (:class:`CaseInputs`), and how they are read from a file of captured inputs
(:func:`read_inputs`; the format: :mod:`kdalab.check.replay`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kdalab.kda import GATES

__all__ = ["CaseInputs", "REQUIRED", "REQUIRED_LOG_DECAY", "OPTIONAL", "GRADIENTS",
           "read_inputs"]


@dataclass(frozen=True)
class CaseInputs:
    """A case's tensors in chunk_kda_fwd's convention: ``q, k, g [B, T, H, K]``, ``v [B, T, H,
    V]`` (bf16), ``beta [B, T, H]`` (logits), ``A_log [H]`` and ``dt_bias [H, K]`` (fp32),
    ``initial_state [N, H, K, V]`` or None, ``cu_seqlens`` (int64) or None. ``rows`` ``[B, T]``
    and ``states`` ``[N]`` mark what is judged (all but a poisoned sequence).

    ``gate`` is the gate mode (:data:`kdalab.kda.GATES`): ``lower_bound`` (g the raw gate input,
    ``lower_bound`` a number), ``unbounded`` (fla's softplus gate, ``lower_bound`` None) or
    ``log_decay`` (g the log-decay itself, fp32 or bf16; ``A_log`` and ``dt_bias`` None;
    ``lower_bound`` the promise that no step decays below it, or None)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor | None
    dt_bias: torch.Tensor | None
    initial_state: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    lower_bound: float | None
    scale: float
    use_qk_l2norm: bool
    rows: torch.Tensor
    states: torch.Tensor
    gate: str = "lower_bound"

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def clone(self) -> CaseInputs:
        return replace(self, **{n: t.clone() for n, t in self.tensors().items()})

    def to(self, device) -> CaseInputs:
        moved = {n: t.to(device) for n, t in self.tensors().items()}
        return replace(self, rows=self.rows.to(device), states=self.states.to(device), **moved)


REQUIRED = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")
OPTIONAL = ("initial_state", "cu_seqlens")
#: the gradients a case's inputs take, by name: the input each is the gradient of
GRADIENTS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "dA_log": "A_log",
             "ddt_bias": "dt_bias", "dh0": "initial_state"}
#: what a file of the ``log_decay`` gate mode needs (g is the log-decay: no gate parameters)
REQUIRED_LOG_DECAY = ("q", "k", "v", "g", "beta")


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


def _gate(meta: dict, path: Path) -> tuple[str, float | None]:
    """The file's gate mode and lower bound: metadata ``gate`` (one of
    :data:`kdalab.kda.GATES`; a file without it holds the lower-bound gate) and ``lower_bound``
    (a number; for ``unbounded`` absent or ``none``, for ``log_decay`` either: the promise)."""
    gate = meta.get("gate", "lower_bound")
    if gate not in GATES:
        raise ValueError(f"--inputs: {str(path)!r}: metadata 'gate' must be one of "
                         f"{', '.join(GATES)}, got {gate!r}")
    if gate != "lower_bound" and meta.get("lower_bound", "none") == "none":
        return gate, None
    if gate == "unbounded":
        raise ValueError(f"--inputs: {str(path)!r}: the unbounded gate takes no lower_bound, "
                         f"got {meta['lower_bound']!r}")
    return gate, _number(meta, "lower_bound", path, None)


def read_inputs(path: str | Path) -> CaseInputs:
    """One file's inputs as a case's (every value judged)."""
    path = Path(path)
    t, meta = _load(path)
    gate, lower_bound = _gate(meta, path)
    required = REQUIRED_LOG_DECAY if gate == "log_decay" else REQUIRED
    missing = [n for n in required if n not in t]
    if missing:
        raise ValueError(f"--inputs: {str(path)!r} lacks the tensors {', '.join(missing)} "
                         f"(expected {', '.join(required)}; optional {', '.join(OPTIONAL)})")
    q, v = t["q"], t["v"]
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"--inputs: {str(path)!r}: q and v must be [B, T, H, K|V], got "
                         f"{tuple(q.shape)} and {tuple(v.shape)}")
    b, n_t, h, kd = q.shape
    cu = t.get("cu_seqlens")
    if cu is not None and (cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dim() != 1):
        raise ValueError(f"--inputs: {str(path)!r}: cu_seqlens must be one row of integers, got "
                         f"{cu.dtype} of shape {tuple(cu.shape)}")
    cu = None if cu is None else cu.to(torch.int64)
    a_log, dt_bias = None, None
    if gate != "log_decay":
        if t["dt_bias"].numel() != h * kd:  # a dt_bias of another shape than q's heads × K
            raise ValueError(f"--inputs: {str(path)!r}: dt_bias must hold H × K = {h} × {kd} "
                             f"values (q is {tuple(q.shape)}), got {tuple(t['dt_bias'].shape)}")
        a_log, dt_bias = t["A_log"].float(), t["dt_bias"].float().reshape(h, kd)
    n = b if cu is None else len(cu) - 1
    scale = _number(meta, "scale", path, kd ** -0.5)
    return CaseInputs(q=q, k=t["k"], v=v, g=t["g"], beta=t["beta"], A_log=a_log,
                      dt_bias=dt_bias, initial_state=t.get("initial_state"), cu_seqlens=cu,
                      lower_bound=lower_bound, scale=scale,
                      use_qk_l2norm=meta.get("use_qk_l2norm", "true") == "true",
                      rows=torch.ones(b, n_t, dtype=torch.bool),
                      states=torch.ones(n, dtype=torch.bool), gate=gate)

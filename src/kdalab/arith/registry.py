"""The registry of accumulation models: every model registers itself here, by name.

This module imports none of the models (they import it), so there is no import cycle: the CPU
models live in :mod:`kdalab.arith.accumulate`, the H200's emulation in
:mod:`kdalab.arith.tensorcore`, the GPU's own arithmetic in :mod:`kdalab.arith.gpu.models`, and
importing :mod:`kdalab.arith` registers all of them.

A model is a value with ``name``, ``out_dtype``, ``needs_cuda`` and ``matmul(a, b)``. Relations
between models are attributes of the model, not tables here: ``gpu_twin`` names the model that
computes the same bits on CUDA tensors (``h200`` → ``gpu-h200``), ``fp32_companion`` the fp32 GEMM
of the same hardware (the H200 models build L with ``h200-sgemm``, as the seed's H200 run did).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["AccumulationModel", "register", "get_accumulation", "available_accumulations",
           "on_device", "fp32_companion", "matmul"]


@runtime_checkable
class AccumulationModel(Protocol):
    """How a batched matrix product is accumulated and rounded.

    ``matmul(a, b)`` takes ``a`` of shape ``[..., M, K]`` and ``b`` of shape ``[..., K, N]``
    (broadcast leading dimensions) and returns ``[..., M, N]`` in ``out_dtype``.
    ``needs_cuda``: the model is GPU hardware and runs on CUDA tensors only (else it runs wherever
    torch runs). ``gpu_twin`` / ``fp32_companion``: names of related models, or None.
    """

    name: str
    out_dtype: torch.dtype
    needs_cuda: bool
    gpu_twin: str | None
    fp32_companion: str | None

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor: ...


_MODELS: dict[str, AccumulationModel] = {}


def register(model: AccumulationModel) -> AccumulationModel:
    """Make ``model`` available by name. A second, different model under a taken name is refused
    (registering the same value again is harmless)."""
    old = _MODELS.get(model.name)
    if old is not None and old != model:
        raise ValueError(f"an accumulation model named {model.name!r} is already registered")
    _MODELS[model.name] = model
    return model


def available_accumulations(cuda: bool = True) -> list[str]:
    """Names of the registered models, in registration order (``cuda=False``: only those that run
    without CUDA)."""
    return [name for name, m in _MODELS.items() if cuda or not m.needs_cuda]


def get_accumulation(name: str | AccumulationModel) -> AccumulationModel:
    """The model registered as ``name`` (a model is returned as it is)."""
    if not isinstance(name, str):
        return name
    try:
        return _MODELS[name]
    except KeyError:
        pass
    import torch  # only to say which models this machine can run

    cuda = torch.cuda.is_available()
    names = ", ".join(available_accumulations(cuda))
    more = "" if cuda else " (models that need CUDA are not listed: none here)"
    raise ValueError(f"unknown accumulation model {name!r}; expected one of {names}{more}")


def on_device(model: AccumulationModel, device_type: str) -> AccumulationModel:
    """The model to run on a device of type ``device_type``: on ``"cuda"`` a CPU emulation that
    has a GPU twin becomes the GPU's own arithmetic; otherwise the model itself."""
    if device_type == "cuda" and model.gpu_twin is not None:
        return _MODELS[model.gpu_twin]
    return model


def fp32_companion(model: AccumulationModel, default: AccumulationModel) -> AccumulationModel:
    """The fp32-accumulate model that belongs with ``model`` (else ``default``)."""
    return default if model.fp32_companion is None else _MODELS[model.fp32_companion]


def matmul(a: torch.Tensor, b: torch.Tensor, accumulation: str | AccumulationModel):
    """``a @ b`` under ``accumulation`` (a model or its name)."""
    return get_accumulation(accumulation).matmul(a, b)

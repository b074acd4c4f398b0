"""The built-in kernels of ``kdalab check`` by name (kdalab, fla, FlashKDA, the recipes) and
the loader of any kernel a user names (``module:attr`` or ``file.py:attr``), each as a
:class:`~kdalab.check.adapters.KernelAdapter` (the convention is there)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from kdalab import peers
from kdalab.check.adapters import KernelAdapter, gate_mode

__all__ = ["BUILTIN", "load_kernel", "recipe_kernel", "KERNEL_HELP"]


# -- the built-in kernels ------------------------------------------------------------------

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kdalab(dot: str, stage2: str = "auto") -> KernelAdapter:
    # chunk_kda_fwd and kda_decode take the convention's gates as they are: the raw gate with a
    # lower bound or None (fla's softplus gate), and gate="log_decay"
    def kdalab_kernel(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
        import kdalab.kernels as kernels  # Triton: imported when the kernel runs

        return kernels.chunk_kda_fwd(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm,
                                     config=kernels.KernelConfig(dot=dot, stage2=stage2),
                                     **kw)

    def kdalab_decode(q, k, v, g, beta, **kw):
        from kdalab.kernels import kda_decode
        return kda_decode(q, k, v, g, beta, **kw)

    def kdalab_chunk_kda(q, k, v, g, beta, **kw):  # the differentiable kernel
        import kdalab.kernels as kernels

        return kernels.chunk_kda(q, k, v, g, beta,
                                 config=kernels.KernelConfig(dot=dot, stage2=stage2),
                                 **kw)

    # Gluon (stage2="gluon") has no interpreter: the GPU only ("auto" plans Triton there)
    devices = ("cuda", "cpu") if _interpreting() and stage2 != "gluon" else ("cuda",)
    return KernelAdapter(kdalab_kernel, devices=devices, requires=("kdalab.kernels",),
                         other_layout={"state_layout": "VK"}, decode=kdalab_decode,
                         grad_fn=kdalab_chunk_kda,
                         note=" (TRITON_INTERPRET=1 runs it on the CPU, slowly: tiny cases only)")


def _fla() -> KernelAdapter:
    # fla's chunk_kda raises "initial_state must be in float32." on a bf16 state: declared
    return KernelAdapter(peers.fla_chunk_kda, name="fla", devices=("cuda",),
                         state_dtypes=(torch.float32,), other_layout={"state_v_first": True},
                         decode=_fla_decode, requires=(peers.PEERS["fla"],),
                         lower_bound_range=(-5.0, 0.0))


def _fla_decode(q, k, v, g, beta, *, state_pool, state_indices, **kw):
    """fla's ``fused_recurrent_kda`` on pool rows (it takes no indices: gathered, written back)."""
    rows = state_indices.long()
    o, s = peers.fla_fused_recurrent_kda(q, k, v, g, beta, initial_state=state_pool[rows],
                                         output_final_state=True, cu_seqlens=None, **kw)
    state_pool[rows] = s.to(state_pool.dtype)
    return o


def _fla_recurrent() -> KernelAdapter:
    return KernelAdapter(peers.fla_fused_recurrent_kda, name="fla-recurrent",
                         devices=("cuda",), other_layout={"state_v_first": True},
                         decode=_fla_decode, requires=(peers.PEERS["fla-recurrent"],),
                         no_backward="fla's fused_recurrent_kda is a forward only")


def _flashkda() -> KernelAdapter:
    # flash_kda.fwd takes K = V = 128 only and the lower-bound gate only (its docstring and
    # csrc/flash_kda.cpp)
    return KernelAdapter(peers.flashkda_fwd, name="flashkda", state_layout="VK",
                         devices=("cuda",), head_dims=(128,), same_head_dims=True,
                         qk_l2norm_flag=None, gates=("lower_bound",),
                         requires=(peers.PEERS["flashkda"],),
                         no_backward="FlashKDA is a forward only (flash_kda.fwd)")


#: Built-in kernels by name (factories: nothing is imported until one is asked for).
BUILTIN: dict[str, Callable[[], KernelAdapter]] = {
    "kdalab": lambda: _kdalab("auto"),
    "kdalab-tf32": lambda: _kdalab("tf32"),
    "kdalab-fp32": lambda: _kdalab("fp32"),
    "kdalab-gluon": lambda: _kdalab("auto", "gluon"),
    "fla": _fla,
    "fla-recurrent": _fla_recurrent,
    "flashkda": _flashkda,
}

#: How each recipe's own kernel runs: (chunk size, tile scaling, inverse).
_RECIPE_KERNELS = {"fla": (64, "secondary-midpoint", "forward_substitution"),
                   "fp64": (16, "chunk_start", "exact")}
_RECIPE_DEFAULT = (16, "chunk_start", "neumann")  # FlashKDA's form


def recipe_kernel(spec: str) -> KernelAdapter:
    """``NAME`` or ``NAME/TILES/INVERSE``, optionally ``@CHUNK``: :func:`kdalab.kda.forward` with
    that recipe (fla's tiles, inverse and chunk 64 for ``fla``; FlashKDA's chunk-start tiles,
    Neumann inverse and chunk 16 for the others)."""
    from kdalab.kda import INVERSES, forward, get_recipe, get_tiles

    body, _, chunk_text = spec.partition("@")
    parts = body.split("/")
    if len(parts) not in (1, 3):
        raise ValueError(f"recipe kernel must be recipe:NAME or recipe:NAME/TILES/INVERSE "
                         f"(optionally @CHUNK), got 'recipe:{spec}'")
    recipe = get_recipe(parts[0])
    chunk, tiles, inverse = _RECIPE_KERNELS.get(recipe.name, _RECIPE_DEFAULT)
    if len(parts) == 3:
        tiles, inverse = parts[1], parts[2]
        get_tiles(tiles)
        if inverse not in INVERSES:
            raise ValueError(f"inverse must be one of {', '.join(INVERSES)}, got {inverse!r}")
    if chunk_text:
        if not chunk_text.isdigit() or int(chunk_text) < 1:
            raise ValueError(f"recipe kernel chunk must be an integer >= 1, got {chunk_text!r}")
        chunk = int(chunk_text)

    def recipe_forward(q, k, v, g, beta, *, use_qk_l2norm=True, gate="raw", **kw):
        return forward(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, recipe=recipe,
                       chunk_size=chunk, tiles=tiles, inverse=inverse,
                       gate=gate_mode(gate, kw["lower_bound"]), **kw)

    # kda.forward checks its inputs: it refuses NaN and inf, and empty packed sequences
    return KernelAdapter(recipe_forward, name=f"recipe:{spec}", finite_only=True,
                         empty_sequences=False, other_layout={"state_layout": "VK"},
                         no_backward=f"{recipe.name} emulates {', '.join(recipe.emulated())}: "
                         "autograd through an emulated rounding is no backward's arithmetic"
                         if recipe.emulated() else "")



def _load_object(spec: str):
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"kernel {spec!r}: expected module:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ValueError(f"kernel {spec!r}: no such file {module_name!r}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` would
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ValueError(f"kernel {spec!r}: no module named {module_name!r}") from None
        raise ValueError(f"kernel {spec!r}: importing {module_name!r} failed: {exc}") from None
    except ValueError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() at import is no verdict either
        raise ValueError(f"kernel {spec!r}: importing {module_name!r} failed: "
                         f"{type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        raise ValueError(f"kernel {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_kernel(spec: str) -> KernelAdapter:
    """A kernel by name: a built-in (``kdalab``, ``kdalab-tf32``, ``kdalab-fp32``,
    ``kdalab-gluon``, ``fla``, ``fla-recurrent``, ``flashkda``), ``recipe:NAME``, or
    ``module:attr`` / ``path/file.py:attr`` naming a function (the convention) or a
    :class:`KernelAdapter`. Raises ValueError for a bad name."""
    spec = spec.strip()
    if spec in BUILTIN:
        return replace(BUILTIN[spec](), name=spec)
    if spec.startswith("recipe:"):
        return recipe_kernel(spec.removeprefix("recipe:"))
    if ":" not in spec:
        raise ValueError(f"unknown kernel {spec!r}; {KERNEL_HELP}")
    obj = _load_object(spec)
    if isinstance(obj, KernelAdapter):
        return replace(obj, name=spec)  # records name the kernel as it was asked for
    if not callable(obj):
        raise ValueError(f"kernel {spec!r} is not a function or a KernelAdapter (got "
                         f"{type(obj).__name__})")
    return KernelAdapter(obj, name=spec)


KERNEL_HELP = ("kernels are kdalab, kdalab-tf32, kdalab-fp32, kdalab-gluon, fla, fla-recurrent, "
               "flashkda, recipe:NAME "
               "(a kdalab.kda recipe), or module:function / file.py:function (chunk_kda_fwd's "
               "convention, or a kdalab.check.KernelAdapter)")

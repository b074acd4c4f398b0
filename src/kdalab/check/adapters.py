"""Kernels under check: one convention, and an adapter for kernels that differ from it.

**The convention** (``kdalab.kernels.chunk_kda_fwd``'s)::

    o, final_state = fn(q, k, v, g, beta, *, scale, initial_state, output_final_state,
                        A_log, dt_bias, lower_bound, cu_seqlens)

``q, k, g [B, T, H, K]`` and ``v [B, T, H, V]`` in bf16, ``beta [B, T, H]`` β *logits*;
``g`` is the raw gate input: the kernel applies ``lower_bound·sigmoid(exp(A_log)·(g + dt_bias))``
(``A_log [H]``, ``dt_bias [H, K]``, both float32); the kernel L2-normalizes q and k;
``initial_state`` ``[N, H, K, V]`` (float32, or bf16 in the ``h0/bf16`` case) or None;
``cu_seqlens`` int64 ``[N + 1]`` or None (then B = 1). ``output_final_state`` is always True, and
the kernel returns ``(o [B, T, H, V], final_state [N, H, K, V])``. The pre-normalized case also
passes ``use_qk_l2norm=False``; a kernel without that keyword is recorded as not supporting it.

:class:`KernelAdapter` wraps a kernel that differs: its state layout (``[N, H, V, K]``), its
``dt_bias`` shape (``[H*K]``), its ``cu_seqlens`` dtype, the initial-state dtypes, head
dimensions, devices and options it supports (a case outside them is recorded as unsupported
without calling the kernel). ``kdalab check mymodule:attr`` takes a function (the convention) or
a :class:`KernelAdapter`.

**Decode** (optional, ``KernelAdapter(decode=…)``, for the decode contract): ``o = decode(q, k, v,
g, beta, *, state_pool, state_indices, scale, A_log, dt_bias, lower_bound)``, ``kda_decode``'s
convention: N sequences' next ``T_new`` tokens, the float32 pool ``[P, H, K, V]`` (in
``state_layout``) updated in place at rows ``state_indices`` (int64 ``[N]``).

A kernel says it does not support a case by raising NotImplementedError (or through its adapter's
declared capabilities); any other exception fails the case. An answer of the wrong form (not a
pair of tensors of the right shapes) is a :class:`ConventionError`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kdalab import params, peers
from kdalab.check.cases import Case, CaseInputs
from kdalab.inputs.sequences import STATE_DTYPES
from kdalab.kda.gate import GATES

__all__ = ["KernelAdapter", "ConventionError", "KernelUnavailable", "BUILTIN", "load_kernel",
           "recipe_kernel", "KERNEL_HELP"]


class ConventionError(Exception):
    """A kernel's answer (or signature) does not follow the convention: the check cannot judge
    it, so the run stops (a usage error of the caller's wrapper, not a result)."""


class KernelUnavailable(Exception):
    """A kernel cannot run here (not importable, or not on this device)."""


_ARGS = ("scale", "initial_state", "output_final_state", "A_log", "dt_bias", "lower_bound",
         "cu_seqlens")
SIGNATURE = ("fn(q, k, v, g, beta, *, scale, initial_state, output_final_state, A_log, dt_bias, "
             "lower_bound, cu_seqlens) -> (o, final_state [N, H, K, V])")


@dataclass(frozen=True)
class KernelAdapter:
    """A kernel and how it departs from the convention.

    ``fn``                the kernel, called with the convention's arguments after the changes
                          below
    ``state_layout``      ``"KV"`` (``[N, H, K, V]``) or ``"VK"`` (``[N, H, V, K]``: FlashKDA's);
                          states are transposed on the way in and out
    ``dt_bias_shape``     ``"HK"`` (``[H, K]``) or ``"flat"`` (``[H*K]``)
    ``cu_seqlens_dtype``  the dtype ``cu_seqlens`` is passed in
    ``state_dtypes``      initial-state dtypes the kernel takes (others: unsupported)
    ``head_dims``         K and V values it takes (None: any); ``same_head_dims``: K must equal V
    ``devices``           device types it runs on
    ``qk_l2norm_flag``    the keyword that turns in-kernel q/k normalization off (None: it
                          always normalizes, pre-normalized cases are unsupported)
    ``finite_only``       it refuses non-finite inputs (poisoned cases: unsupported)
    ``empty_sequences``   it takes zero-length packed sequences
    ``lower_bound_range`` ``(low, high)``: the lower bounds it takes, low <= lower_bound < high
                          (None: any, every lower bound < 0)
    ``gates``             the gate modes it takes (:data:`kdalab.kda.gate.GATES`): the
                          lower-bounded sigmoid gate ``lower_bound``, fla's unbounded softplus
                          gate ``unbounded`` (lower_bound None), a ``precomputed`` log-decay
    ``other_layout``      keyword arguments that switch the kernel to the other state layout
                          (None: it takes one; the layout contract is then unsupported)
    ``decode``            its decode function (module docstring; ``dt_bias`` as above), or
                          None: the decode contract is then unsupported
    ``requires``          import names that must be importable (checked before the run)
    ``note``              appended to the message when the kernel cannot run here
    """

    fn: Callable
    name: str = ""
    state_layout: str = "KV"
    dt_bias_shape: str = "HK"
    cu_seqlens_dtype: torch.dtype = torch.int64
    state_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    head_dims: tuple[int, ...] | None = None
    same_head_dims: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    qk_l2norm_flag: str | None = "use_qk_l2norm"
    finite_only: bool = False
    empty_sequences: bool = True
    lower_bound_range: tuple[float, float] | None = None
    gates: tuple[str, ...] = ("lower_bound",)
    other_layout: dict | None = None
    decode: Callable | None = None
    requires: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"KernelAdapter.fn must be callable, got {type(self.fn).__name__}")
        if self.decode is not None and not callable(self.decode):
            raise ValueError(f"KernelAdapter.decode must be callable or None, got "
                             f"{type(self.decode).__name__}")
        if self.state_layout not in ("KV", "VK"):
            raise ValueError(f"state_layout must be 'KV' or 'VK', got {self.state_layout!r}")
        if self.dt_bias_shape not in ("HK", "flat"):
            raise ValueError(f"dt_bias_shape must be 'HK' or 'flat', got {self.dt_bias_shape!r}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", "kernel"))
        if self.lower_bound_range is not None:
            low, high = self.lower_bound_range
            if not (low < high <= 0):
                raise ValueError(f"lower_bound_range must be (low, high) with low < high <= 0, "
                                 f"got {self.lower_bound_range!r}")
        object.__setattr__(self, "gates", tuple(params.choice(g, "gates", GATES)
                                                for g in self.gates))

    # -- before the run ---------------------------------------------------------------------

    def check_available(self, device: str) -> None:
        """Raise :class:`KernelUnavailable` if the kernel cannot run on ``device`` at all."""
        kind = torch.device(device).type
        if kind not in self.devices:
            raise KernelUnavailable(f"kernel {self.name!r} runs on {' or '.join(self.devices)} "
                                    f"only, not {kind}{self.note}")
        for module in self.requires:
            try:
                importlib.import_module(module)
            except Exception as exc:  # an ImportError, or a failure inside the package
                raise KernelUnavailable(f"kernel {self.name!r} needs {module!r}, which cannot "
                                        f"be imported here ({type(exc).__name__}: {exc})") from None
        self._check_signature()

    def _check_signature(self) -> None:
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError):  # a builtin without a signature: judged by its calls
            return
        dummy = {name: None for name in _ARGS}
        try:
            sig.bind(*([None] * 5), **dummy)
        except TypeError as exc:
            raise ConventionError(f"kernel {self.name!r} does not take the convention's "
                                  f"arguments ({exc}); expected {SIGNATURE}") from None

    # -- per case ---------------------------------------------------------------------------

    def declines(self, *, K: int, V: int, lower_bound: float | None, gate: str = "lower_bound",
                 state_dtype: torch.dtype | None = None) -> str | None:
        """Why the kernel declares it cannot take inputs of these dims, gate and initial-state
        dtype (None: no initial state), or None: what ``check`` and ``hunt`` ask before they
        run anything (:meth:`declines_case`, :func:`kdalab.hunt.search.supported_bounds`)."""
        if self.head_dims is not None and (K not in self.head_dims or V not in self.head_dims):
            return f"head dims K={K}, V={V}: takes {', '.join(map(str, self.head_dims))}"
        if self.same_head_dims and K != V:
            return f"K={K} != V={V}: takes K = V only"
        if gate not in self.gates:
            return f"gate {gate!r}: takes {', '.join(self.gates)}"
        if self.lower_bound_range is not None and lower_bound is not None:
            low, high = self.lower_bound_range
            if not low <= lower_bound < high:
                return f"lower bound {lower_bound:g}: takes lower bounds in [{low:g}, {high:g})"
        if state_dtype is not None and state_dtype not in self.state_dtypes:
            return (f"initial state in {str(state_dtype).removeprefix('torch.')}: takes "
                    f"{', '.join(str(d).removeprefix('torch.') for d in self.state_dtypes)}")
        return None

    def declines_case(self, case: Case) -> str | None:
        """:meth:`declines` for a case, from its parameters (before its inputs are drawn)."""
        return self.declines(K=case.K, V=case.V, lower_bound=case.lower_bound,
                             state_dtype=STATE_DTYPES[case.initial_state])

    def unsupported(self, x: CaseInputs) -> str | None:
        """Why the kernel declares it cannot take these inputs, or None."""
        h0 = x.initial_state
        why = self.declines(K=x.q.shape[-1], V=x.v.shape[-1], lower_bound=x.lower_bound,
                            gate=x.gate, state_dtype=None if h0 is None else h0.dtype)
        if why is not None:
            return why
        if not x.use_qk_l2norm and not self._takes(self.qk_l2norm_flag):
            return "always L2-normalizes q and k (no way to turn it off)"
        if self.finite_only and not all(bool(t.isfinite().all()) for t in (x.q, x.k, x.v)):
            return "takes finite inputs only"
        if (not self.empty_sequences and x.cu_seqlens is not None
                and bool((x.cu_seqlens.diff() == 0).any())):
            return "takes no empty sequences"
        return None

    def _takes(self, keyword: str | None) -> bool:
        if keyword is None:
            return False
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return True
        return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    def __call__(self, x: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the kernel on ``x``; ``(o [B, T, H, V], final_state [N, H, K, V])``."""
        h0 = x.initial_state
        if h0 is not None and self.state_layout == "VK":
            h0 = h0.transpose(-1, -2).contiguous()
        dt_bias = x.dt_bias.reshape(-1) if self.dt_bias_shape == "flat" else x.dt_bias
        cu = None if x.cu_seqlens is None else x.cu_seqlens.to(self.cu_seqlens_dtype)
        kw = dict(scale=x.scale, initial_state=h0, output_final_state=True, A_log=x.A_log,
                  dt_bias=dt_bias, lower_bound=x.lower_bound, cu_seqlens=cu)
        if not x.use_qk_l2norm:
            kw[self.qk_l2norm_flag] = False
        out = self.fn(x.q, x.k, x.v, x.g, x.beta, **kw)
        return self._check_answer(out, x)

    def in_other_layout(self) -> KernelAdapter | None:
        """The same kernel called with its states in the other layout, or None."""
        if self.other_layout is None:
            return None
        return replace(self, fn=functools.partial(self.fn, **self.other_layout),
                       state_layout="VK" if self.state_layout == "KV" else "KV",
                       other_layout=None, decode=None)  # the decode keeps its own layout

    def decode_step(self, x: CaseInputs, pool, indices) -> torch.Tensor:
        """One step of ``decode``: the tokens of ``x`` (fixed length, ``[N, T_new, ...]``) from
        pool rows ``indices`` (the pool in ``state_layout``); ``o [N, T_new, H, V]``."""
        dt_bias = x.dt_bias.reshape(-1) if self.dt_bias_shape == "flat" else x.dt_bias
        kw = dict(state_pool=pool, state_indices=indices, scale=x.scale, A_log=x.A_log,
                  dt_bias=dt_bias, lower_bound=x.lower_bound)
        if not x.use_qk_l2norm:
            kw[self.qk_l2norm_flag] = False
        o = self.decode(x.q, x.k, x.v, x.g, x.beta, **kw)
        if not isinstance(o, torch.Tensor) or o.shape != x.v.shape \
                or not o.dtype.is_floating_point or o.device != x.v.device:
            got = (f"o of shape {list(o.shape)} in {o.dtype} on {o.device}"
                   if isinstance(o, torch.Tensor) else f"a {type(o).__name__}")
            raise ConventionError(f"kernel {self.name!r}'s decode returned {got}; expected a "
                                  f"float tensor of shape {list(x.v.shape)} on {x.v.device}")
        return o.detach()

    def _check_answer(self, out, x: CaseInputs):
        where = f"kernel {self.name!r} returned"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            what = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
                    else f"a {type(out).__name__}")
            raise ConventionError(f"{where} {what}; expected (o, final_state)")
        o, s = out
        n = x.q.shape[0] if x.cu_seqlens is None else len(x.cu_seqlens) - 1
        h, kd = x.q.shape[2], x.q.shape[3]
        vd = x.v.shape[3]
        want = (n, h, kd, vd) if self.state_layout == "KV" else (n, h, vd, kd)
        for label, t, shape in (("o", o, tuple(x.v.shape)), ("final_state", s, want)):
            if not isinstance(t, torch.Tensor):
                raise ConventionError(f"{where} {label} as a {type(t).__name__}; expected a "
                                      f"tensor of shape {list(shape)}")
            if tuple(t.shape) != shape:
                raise ConventionError(f"{where} {label} of shape {list(t.shape)}; expected "
                                      f"{list(shape)} ({self.state_layout} state layout)")
            if not t.dtype.is_floating_point:
                raise ConventionError(f"{where} {label} in {t.dtype}; expected a float tensor")
            if t.device != x.v.device:
                raise ConventionError(f"{where} {label} on {t.device}; the inputs are on "
                                      f"{x.v.device}")
        if self.state_layout == "VK":
            s = s.transpose(-1, -2)
        return o.detach(), s.detach()


# -- the built-in kernels ------------------------------------------------------------------

def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kdalab(config_name: str) -> KernelAdapter:
    def kdalab_kernel(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
        import kdalab.kernels as kernels  # Triton: imported when the kernel runs

        return kernels.chunk_kda_fwd(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm,
                                     config=getattr(kernels, config_name), **kw)

    def kdalab_decode(q, k, v, g, beta, **kw):
        from kdalab.kernels import kda_decode
        return kda_decode(q, k, v, g, beta, **kw)

    devices = ("cuda", "cpu") if _interpreting() else ("cuda",)
    # chunk_kda_fwd takes lower bounds in [-5, 0): 16 steps at -5 keep exp(±G) in fp32 and its
    # bf16 operands (docs/kernels.md; kernels/shapes.py checks it on every call)
    return KernelAdapter(kdalab_kernel, devices=devices, requires=("kdalab.kernels",),
                         lower_bound_range=(-5.0, 0.0),
                         other_layout={"state_layout": "VK"}, decode=kdalab_decode,
                         note=" (TRITON_INTERPRET=1 runs it on the CPU, slowly: tiny cases only)")


def _fla() -> KernelAdapter:
    # fla's chunk_kda raises "initial_state must be in float32." on a bf16 state: declared
    return KernelAdapter(peers.fla_chunk_kda, name="fla", devices=("cuda",),
                         state_dtypes=(torch.float32,), other_layout={"state_v_first": True},
                         decode=_fla_decode, requires=(peers.PEERS["fla"],))


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
                         decode=_fla_decode, requires=(peers.PEERS["fla-recurrent"],))


def _flashkda() -> KernelAdapter:
    # flash_kda.fwd takes K = V = 128 only (its docstring and csrc/flash_kda.cpp)
    return KernelAdapter(peers.flashkda_fwd, name="flashkda", state_layout="VK",
                         devices=("cuda",), head_dims=(128,), same_head_dims=True,
                         qk_l2norm_flag=None, requires=(peers.PEERS["flashkda"],))


#: Built-in kernels by name (factories: nothing is imported until one is asked for).
BUILTIN: dict[str, Callable[[], KernelAdapter]] = {
    "kdalab": lambda: _kdalab("DEFAULT_CONFIG"),
    "kdalab-tf32": lambda: _kdalab("TF32_CONFIG"),
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

    def recipe_forward(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
        return forward(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, recipe=recipe,
                       chunk_size=chunk, tiles=tiles, inverse=inverse, **kw)

    # kda.forward checks its inputs: it refuses NaN and inf, and empty packed sequences
    return KernelAdapter(recipe_forward, name=f"recipe:{spec}", finite_only=True,
                         empty_sequences=False, other_layout={"state_layout": "VK"})


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
    """A kernel by name: a built-in (``kdalab``, ``kdalab-tf32``, ``fla``, ``fla-recurrent``,
    ``flashkda``), ``recipe:NAME``, or ``module:attr`` / ``path/file.py:attr`` naming a function
    (the convention) or a :class:`KernelAdapter`. Raises ValueError for a bad name."""
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


KERNEL_HELP = ("kernels are kdalab, kdalab-tf32, fla, fla-recurrent, flashkda, recipe:NAME "
               "(a kdalab.kda recipe), or module:function / file.py:function (chunk_kda_fwd's "
               "convention, or a kdalab.check.KernelAdapter)")

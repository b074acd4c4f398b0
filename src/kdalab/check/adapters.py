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

**Gates** (a case's gate mode, :data:`kdalab.kda.GATES`, in chunk_kda_fwd's words): the
lower-bound gate as above; ``unbounded``: ``lower_bound=None``, fla's softplus gate
``−exp(A_log)·softplus(g + dt_bias)``; ``log_decay``: also ``gate="log_decay"`` (passed for this
mode only), g the log-decay itself (fp32 or bf16), ``A_log = dt_bias = None``, ``lower_bound`` the
promise that no step decays below it, or None. A kernel declares the modes it takes
(``gates``); a ``log_decay`` case needs a ``gate`` keyword. :func:`gate_mode` reads the mode back
from the arguments.

:class:`KernelAdapter` wraps a kernel that differs: its state layout (``[N, H, V, K]``), its
``dt_bias`` shape (``[H*K]``), its ``cu_seqlens`` dtype, the initial-state dtypes, head
dimensions, devices and options it supports (a case outside them is recorded as unsupported
without calling the kernel). ``kdalab check mymodule:attr`` takes a function (the convention) or
a :class:`KernelAdapter`.

**Decode** (optional, ``KernelAdapter(decode=…)``, for the decode contract): ``o = decode(q, k, v,
g, beta, *, state_pool, state_indices, scale, A_log, dt_bias, lower_bound)``, ``kda_decode``'s
convention: N sequences' next ``T_new`` tokens, the float32 pool ``[P, H, K, V]`` (in
``state_layout``) updated in place at rows ``state_indices`` (int64 ``[N]``).

**Gradients** (``--grad``): torch's autograd through the kernel (or its ``grad_fn``), see
:meth:`KernelAdapter.differentiate`; a kernel without a backward declares why (``no_backward``).

A kernel says it does not support a case by raising NotImplementedError (or through its adapter's
declared capabilities); any other exception fails the case. An answer of the wrong form (not a
pair of tensors of the right shapes) is a :class:`ConventionError`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kdalab import params
from kdalab.check.cases import Case, CaseInputs
from kdalab.check.tensors import GRADIENTS
from kdalab.inputs.sequences import STATE_DTYPES
from kdalab.kda import GATES

__all__ = ["KernelAdapter", "ConventionError", "KernelUnavailable", "gate_mode"]


class ConventionError(Exception):
    """A kernel's answer (or signature) does not follow the convention: the check cannot judge
    it, so the run stops (a usage error of the caller's wrapper, not a result)."""


class KernelUnavailable(Exception):
    """A kernel cannot run here (not importable, or not on this device)."""


_ARGS = ("scale", "initial_state", "output_final_state", "A_log", "dt_bias", "lower_bound",
         "cu_seqlens")
SIGNATURE = ("fn(q, k, v, g, beta, *, scale, initial_state, output_final_state, A_log, dt_bias, "
             "lower_bound, cu_seqlens) -> (o, final_state [N, H, K, V])")


def gate_mode(gate: str, lower_bound: float | None) -> str:
    """The gate mode (:data:`kdalab.kda.GATES`) of a call in the convention: ``gate="log_decay"``,
    else the raw gate input with a lower bound (``lower_bound``) or without (``unbounded``)."""
    if gate == "log_decay":
        return "log_decay"
    return "unbounded" if lower_bound is None else "lower_bound"


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
    ``gates``             the gate modes it takes (:data:`kdalab.kda.GATES`): the
                          lower-bounded sigmoid gate ``lower_bound``, fla's unbounded softplus
                          gate ``unbounded`` (lower_bound None), a ``log_decay`` g; others:
                          unsupported
    ``other_layout``      keyword arguments that switch the kernel to the other state layout
                          (None: it takes one; the layout contract is then unsupported)
    ``decode``            its decode function (module docstring; ``dt_bias`` as above), or
                          None: the decode contract is then unsupported
    ``grad_fn``           its differentiable form (the convention; torch autograd through it
                          gives the gradients), or None: ``fn`` itself
    ``no_backward``       why it has no backward (``--grad``: every case unsupported), or ""
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
    other_layout: dict | None = None
    decode: Callable | None = None
    grad_fn: Callable | None = None
    no_backward: str = ""
    gates: tuple[str, ...] = GATES
    requires: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"KernelAdapter.fn must be callable, got {type(self.fn).__name__}")
        for name in ("decode", "grad_fn"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"KernelAdapter.{name} must be callable or None, got "
                                 f"{type(getattr(self, name)).__name__}")
        if self.state_layout not in ("KV", "VK"):
            raise ValueError(f"state_layout must be 'KV' or 'VK', got {self.state_layout!r}")
        if self.dt_bias_shape not in ("HK", "flat"):
            raise ValueError(f"dt_bias_shape must be 'HK' or 'flat', got {self.dt_bias_shape!r}")
        if not self.gates:
            raise ValueError(f"gates must be some of {', '.join(GATES)}, got {self.gates!r}")
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
            return f"the {gate} gate: takes {', '.join(self.gates)}"
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
        return self.declines(K=case.K, V=case.V, lower_bound=case.lower_bound, gate=case.gate,
                             state_dtype=STATE_DTYPES[case.initial_state])

    def unsupported(self, x: CaseInputs) -> str | None:
        """Why the kernel declares it cannot take these inputs, or None."""
        if x.gate == "log_decay" and not self._takes("gate"):
            return "takes no gate keyword (g as the log-decay: gate='log_decay')"
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
        o, s = self._call(self.fn, x)
        return o.detach(), s.detach()

    def differentiate(self, x: CaseInputs, do: torch.Tensor, dht: torch.Tensor):
        """The kernel's differentiable form on ``x`` (every input that takes a gradient a leaf),
        ``do`` and ``dht [N, H, K, V]`` backpropagated from o and the final state: ``(o,
        final_state, {name: gradient})`` (:data:`~kdalab.check.tensors.GRADIENTS`; zeros for
        an unused input). NotImplementedError if the adapter declares no backward."""
        if self.no_backward:
            raise NotImplementedError(f"no backward: {self.no_backward}")
        leaves = {n: getattr(x, i).detach().requires_grad_() for n, i in GRADIENTS.items()
                  if getattr(x, i) is not None}
        with torch.enable_grad():
            o, s = self._call(self.grad_fn or self.fn,
                              replace(x, **{GRADIENTS[n]: t for n, t in leaves.items()}))
            for label, t in (("o", o), ("final_state", s)):
                if t.grad_fn is None:  # a kernel without a backward says so (no_backward)
                    raise ConventionError(f"kernel {self.name!r} returned {label} without a "
                                          "gradient (no autograd graph)")
            got = torch.autograd.grad((o, s), list(leaves.values()),
                                      (do.to(o.dtype), dht.to(s.dtype)), allow_unused=True)
        grads = {n: torch.zeros_like(t) if g is None else g.detach()
                 for (n, t), g in zip(leaves.items(), got)}
        return o.detach(), s.detach(), grads

    def _call(self, fn: Callable, x: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``fn`` on ``x`` in the convention, its answer checked; the final state ``[N, H, K,
        V]`` (transposed back from the adapter's layout), neither detached."""
        h0 = x.initial_state
        if h0 is not None and self.state_layout == "VK":
            h0 = h0.transpose(-1, -2).contiguous()
        cu = None if x.cu_seqlens is None else x.cu_seqlens.to(self.cu_seqlens_dtype)
        kw = dict(scale=x.scale, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                  **self._gate_and_flags(x))
        return self._check_answer(fn(x.q, x.k, x.v, x.g, x.beta, **kw), x)

    def _gate_and_flags(self, x: CaseInputs) -> dict:
        """The gate's arguments (the module's **Gates**) and the normalization flag."""
        dt_bias = x.dt_bias
        if dt_bias is not None and self.dt_bias_shape == "flat":
            dt_bias = dt_bias.reshape(-1)
        kw = dict(A_log=x.A_log, dt_bias=dt_bias, lower_bound=x.lower_bound)
        if x.gate == "log_decay":
            kw["gate"] = "log_decay"
        if not x.use_qk_l2norm:
            kw[self.qk_l2norm_flag] = False
        return kw

    def in_other_layout(self) -> KernelAdapter | None:
        """The same kernel called with its states in the other layout, or None."""
        if self.other_layout is None:
            return None
        grad_fn = (None if self.grad_fn is None
                   else functools.partial(self.grad_fn, **self.other_layout))
        return replace(self, fn=functools.partial(self.fn, **self.other_layout),
                       grad_fn=grad_fn, state_layout="VK" if self.state_layout == "KV" else "KV",
                       other_layout=None, decode=None)  # the decode keeps its own layout

    def decode_step(self, x: CaseInputs, pool, indices) -> torch.Tensor:
        """One step of ``decode``: the tokens of ``x`` (fixed length, ``[N, T_new, ...]``) from
        pool rows ``indices`` (the pool in ``state_layout``); ``o [N, T_new, H, V]``."""
        o = self.decode(x.q, x.k, x.v, x.g, x.beta, state_pool=pool, state_indices=indices,
                        scale=x.scale, **self._gate_and_flags(x))
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
        return o, (s.transpose(-1, -2) if self.state_layout == "VK" else s)

"""What is hunted: a kernel named as ``kdalab check`` names it, as a plain callable on a draw.

The one coupling of the hunt to :mod:`kdalab.check` is :func:`resolve` (and the default
threshold): check turns a name (``kdalab``, ``fla``, ``flashkda``, ``recipe:NAME``,
``module:function``) into an adapter that calls the kernel in chunk_kda_fwd's convention and
returns ``(o, final_state [N, H, K, V])``; here a draw of
:func:`kdalab.inputs.sequences.draw` is handed to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Target", "TargetError", "resolve", "default_threshold", "as_case"]


class TargetError(ValueError):
    """The target cannot be hunted: unknown, not runnable on the device, or its answer does not
    follow the convention."""


@dataclass(frozen=True)
class Target:
    """``run(inputs) -> (o, final_state)``; ``why_not(inputs)``: why the kernel declares it
    cannot take these inputs (it is then not called), or None; ``differentiate(inputs, do,
    dht) -> (o, final_state, {gradient name: tensor})`` (``--grad``; None: it has no backward);
    ``declines(K=, V=, lower_bound=, gate=, state_dtype=)``: what ``why_not`` says, asked of
    parameters before anything is drawn (:meth:`kdalab.check.KernelAdapter.declines`; None:
    only ``why_not`` is known).
    """

    name: str
    device: str
    run: Callable[[dict], tuple[torch.Tensor, torch.Tensor]]
    why_not: Callable[[dict], str | None]
    differentiate: Callable | None = None
    declines: Callable[..., str | None] | None = None


#: the absolute output error a hunt reports as a finding by default: check's absolute output
#: limit (``kdalab check --max-output-error``) as it was before check judged by multiples of the
#: floor. A hunt compares kernels across inputs whose floors differ by orders of magnitude, so it
#: keeps one absolute line; the floor multiple of the worst case is in its report.
DEFAULT_THRESHOLD = 1e-2


def default_threshold() -> float:
    """The output error above which a hunt's finding fails (:data:`DEFAULT_THRESHOLD`)."""
    return DEFAULT_THRESHOLD


def as_case(x: dict):
    """A draw as check's :class:`~kdalab.check.tensors.CaseInputs` (every value judged)."""
    from kdalab.check.cases import CaseInputs

    b, t = x["q"].shape[:2]
    n = b if x["cu_seqlens"] is None else len(x["cu_seqlens"]) - 1
    dev = x["q"].device
    return CaseInputs(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
        dt_bias=x["dt_bias"], initial_state=x["initial_state"], cu_seqlens=x["cu_seqlens"],
        lower_bound=x["lower_bound"], scale=x["scale"], use_qk_l2norm=x["use_qk_l2norm"],
        rows=torch.ones(b, t, dtype=torch.bool, device=dev),
        states=torch.ones(n, dtype=torch.bool, device=dev), gate=x["gate"])


def resolve(name: str, device: str, grad: bool = False) -> Target:
    """The kernel ``name`` on ``device`` (TargetError, a ValueError, when it cannot run there,
    or, with ``grad``, when it declares no backward)."""
    from kdalab.check import ConventionError, KernelUnavailable, load_kernel

    try:
        kernel = load_kernel(name)
        kernel.check_available(device)
    except (ValueError, KernelUnavailable, ConventionError) as exc:
        raise TargetError(str(exc)) from None
    if grad and kernel.no_backward:
        raise TargetError(f"--grad: {name} has no backward ({kernel.no_backward})")

    def guarded(call):
        def run(x: dict, *upstream):
            try:
                return call(as_case(x), *upstream)
            except ConventionError as exc:
                raise TargetError(str(exc)) from None
        return run

    return Target(name=name, device=device, run=guarded(kernel),
                  why_not=lambda x: kernel.unsupported(as_case(x)),
                  differentiate=None if kernel.no_backward else guarded(kernel.differentiate),
                  declines=kernel.declines)

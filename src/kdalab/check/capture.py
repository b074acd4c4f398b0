"""Capture a model's real KDA inputs for ``kdalab check KERNEL --inputs FOLDER``.

::

    from kdalab.check.capture import capture

    with capture("fla.layers.kda:chunk_kda", "captured/", limit=8) as cap:
        model(batch)                     # each call of that function writes one file
    print(cap.paths)

``target`` names the function *where the model looks it up* (``module:attribute``, or a pair
``(module_or_object, "attribute")``): a layer that did ``from fla.ops.kda import chunk_kda``
calls its own module's binding. The function is replaced by a wrapper for the duration of the
block; each call still runs and returns as before, and the inputs of the first ``limit`` calls
are written (:func:`kdalab.check.replay.write_inputs`) with their gate mode: fla's
``use_gate_in_kernel=False`` and chunk_kda_fwd's ``gate="log_decay"`` are ``log_decay``, a raw
gate without a lower bound ``unbounded``, ``kdalab.kda.forward``'s ``gate`` is its own. Calls in a
form ``check`` cannot replay (β after its sigmoid, a raw gate without ``A_log`` or ``dt_bias``)
are counted in ``cap.skipped`` with the reason, not written. docs/check.md has a runnable
example.
"""

from __future__ import annotations

import importlib
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kdalab.check.adapters import gate_mode
from kdalab.check.replay import write_inputs
from kdalab.kda import GATES

__all__ = ["capture", "Capture"]


@dataclass
class Capture:
    """What a :func:`capture` block wrote: ``paths`` (one file per call, in order) and
    ``skipped`` (``reason -> count`` of calls not written)."""

    folder: Path
    limit: int
    paths: list[Path] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    calls: int = 0


def _resolve(target):
    if isinstance(target, str):
        module, _, attr = target.rpartition(":")
        if not module or not attr:
            raise ValueError(f"target must be 'module:attribute', got {target!r}")
        try:
            owner = importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"target {target!r}: cannot import {module!r} ({exc})") from None
    else:
        owner, attr = target
    if not callable(getattr(owner, attr, None)):
        raise ValueError(f"target: {owner!r} has no function {attr!r}")
    return owner, attr


def _gate(args: dict) -> str:
    """The call's gate mode (:data:`kdalab.kda.GATES`), in fla's, chunk_kda_fwd's or
    ``kdalab.kda.forward``'s words."""
    if args.get("use_gate_in_kernel") is False:
        return "log_decay"
    gate = args.get("gate", "raw")
    return gate if gate in GATES else gate_mode(gate, args.get("lower_bound"))


def _why_not(args: dict, gate: str) -> str | None:
    """Why a call's inputs are not in the replayable form, or None."""
    if args.get("use_beta_sigmoid_in_kernel") is False or args.get("beta_is_logits") is False:
        return "beta given after its sigmoid"
    if gate != "log_decay" and (args.get("A_log") is None or args.get("dt_bias") is None):
        return "no A_log or dt_bias"
    return None


@contextmanager
def capture(target, folder, *, limit: int = 16, prefix: str = "call"):
    """Wrap ``target`` (a KDA forward with ``chunk_kda_fwd``'s or fla ``chunk_kda``'s argument
    names) for the block; write the inputs of its first ``limit`` calls to
    ``folder/<prefix>_NNNN.safetensors``. Yields a :class:`Capture`."""
    if not (isinstance(limit, int) and limit >= 1):
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    owner, attr = _resolve(target)
    original = getattr(owner, attr)
    signature = inspect.signature(original)
    cap = Capture(Path(folder).expanduser(), limit)

    def wrapper(*args, **kwargs):
        cap.calls += 1
        if len(cap.paths) < limit:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            named = dict(bound.arguments)
            named.update(named.pop("kwargs", {}) or {})
            gate = _gate(named)
            why = _why_not(named, gate)
            h0 = named.get("initial_state")
            if h0 is not None and (named.get("state_layout") == "VK"
                                   or named.get("state_v_first")):
                named["initial_state"] = h0.transpose(-1, -2)  # files hold [N, H, K, V]
            if why is None:
                path = cap.folder / f"{prefix}_{len(cap.paths):04d}.safetensors"
                lower_bound = None if gate == "unbounded" else named.get("lower_bound")
                cap.paths.append(write_inputs(path, named, lower_bound=lower_bound,
                                              scale=named.get("scale"), gate=gate))
            else:
                cap.skipped[why] = cap.skipped.get(why, 0) + 1
        return original(*args, **kwargs)

    setattr(owner, attr, wrapper)
    try:
        yield cap
    finally:
        setattr(owner, attr, original)

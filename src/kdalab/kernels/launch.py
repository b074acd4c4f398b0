"""Launching a Triton kernel that has already been compiled, without the per-call work of
``JITFunction.run``.

``kernel[grid](*args, **kwargs)`` binds the arguments, specializes each one natively,
builds a cache key from the specialization and ``str(options)``, looks the compiled kernel
up, checks the globals it used, builds launch metadata and only then calls the compiled
kernel's launcher. On the H200's host that is about 54 µs a launch, of which the launcher
itself is 13 (cProfile, docs/kernels.md "Host overhead"); a short prefill makes three
launches and is bound by the host.

:func:`launch` keeps, per JIT function, a table from what Triton specializes on to the
compiled kernel Triton returned the first time (through ``kernel[grid]``, which compiles it),
and later calls that kernel's launcher with the same arguments ``JITFunction.run`` would
pass it: every parameter in signature order, constexprs included. What Triton specializes a
non-constexpr argument on (``native_specialize_impl``; triton 3.6 and 3.9 alike): a tensor's
dtype and whether its address is a multiple of 16; an integer's width (int32, int64,
uint64), whether it is 1 and whether it is a multiple of 16; a float or bool by type; None
as a constexpr; a tensor descriptor by its base's dtype and its block (the launcher builds
its TMA map from the descriptor every call, as on Triton's path). The key here holds each
of those, every constexpr's value and the options
(``num_warps``, ``num_stages``), so a call that Triton would compile differently misses the
table and goes through ``kernel[grid]`` (which compiles or finds the other kernel). Anything
else — launch hooks (profilers), pre-run hooks, the interpreter — takes ``kernel[grid]``
every time.

The entry points' default, ``launch="replay"`` (``replay.py``), goes further: a call of a key
seen before replays the first call's launches, and none of this runs.
"""

from __future__ import annotations

import threading

import torch
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

_TABLES: dict = {}  # JIT function -> (names, their set, constexpr flags, defaults, {key: kernel})
_DRIVER: list = []  # (get_current_device, get_current_stream, knobs.runtime), found once
#: ``.recorder``: the call being recorded on this thread (``replay.Recorder``), or None
RECORDING = threading.local()
_TENSOR = torch.Tensor
#: the entry points' ``launch=`` / ``KernelConfig.launch`` -> :func:`launch`'s ``direct``
LAUNCH_MODES = {"replay": True, "direct": True, "triton": False}


class _Unkeyed(Exception):
    """An argument whose specialization this module does not know (take Triton's path)."""


def _spec(value):
    """What Triton specializes a non-constexpr argument on (module docstring)."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if value is None:
        return None
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        width = 0 if -2**31 <= value < 2**31 else 1 if -2**63 <= value < 2**63 else 2
        return width, value == 1, value % 16 == 0
    if isinstance(value, float):
        return float
    if isinstance(value, TensorDescriptor):
        # Triton's type string is the base's dtype and the block (and the padding), with no
        # alignment key (``native_specialize_impl``: ``('tensordesc<fp32[1, 64, 128]>',
        # None)`` whatever the base's address, triton 3.9); the round-to-tf32 flag and the
        # rank are kept too, as the launcher's map depends on them
        return (TensorDescriptor, value.base.dtype, tuple(value.block_shape), len(value.shape),
                getattr(value, "padding", None), getattr(value, "round_f32_to_tf32", None))
    raise _Unkeyed


def _table(fn):
    table = _TABLES.get(fn)
    if table is None:
        params = fn.params
        names = [p.name for p in params]
        table = (names, frozenset(names), [p.is_constexpr for p in params],
                 [p.default if p.has_default else _Unkeyed for p in params], {})
        _TABLES[fn] = table
    return table


def _driver():
    if not _DRIVER:
        from triton import knobs
        from triton.runtime.driver import driver

        _DRIVER.extend((driver.active.get_current_device, driver.active.get_current_stream,
                        knobs.runtime))
    return _DRIVER


def current_device():
    """The device Triton launches on (its driver's current device)."""
    return _driver()[0]()


def _hooked(hook) -> bool:
    """Whether a launch hook is set: triton 3.6 and 3.9 hold a chain of hooks (empty when
    none is set, then JITFunction.run still builds launch metadata and calls it), earlier
    versions None."""
    return hook is not None and getattr(hook, "calls", True) != []


def _triton_path(fn, grid, args, kwargs, rec) -> None:
    """``fn[grid](*args, **kwargs)``; a call being recorded cannot be replayed then."""
    fn[grid](*args, **kwargs)
    if rec is not None:
        rec.refused = True


def launch(fn, grid, args, kwargs, *, direct=True):
    """``fn[grid](*args, **kwargs)``; with ``direct``, through the compiled kernel's launcher
    once Triton has compiled it for this specialization (module docstring). ``grid`` is a
    tuple of one to three ints."""
    rec = getattr(RECORDING, "recorder", None)
    if not direct or not isinstance(fn, JITFunction) or fn.pre_run_hooks:
        return _triton_path(fn, grid, args, kwargs, rec)  # the interpreter's: not JITFunctions
    get_device, get_stream, runtime = _driver()
    if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
        return _triton_path(fn, grid, args, kwargs, rec)
    names, known, constexpr, defaults, kernels = _table(fn)
    values = list(args)
    try:
        for name in names[len(args):]:
            value = kwargs.get(name, defaults[len(values)])
            if value is _Unkeyed:
                raise _Unkeyed  # a missing argument: let Triton say so
            values.append(value)
        # the options in the caller's order (another order is another entry, as correct)
        options = tuple([(k, v) for k, v in kwargs.items() if k not in known])
        device = get_device()
        # _spec inlined for tensors, the most common argument (half the time of a key)
        key = (device, options, tuple([
            v if c else (v.dtype, not v.data_ptr() & 15) if v.__class__ is _TENSOR
            else _spec(v) for v, c in zip(values, constexpr)]))
        kernel = kernels.get(key)
    except (_Unkeyed, TypeError):  # TypeError: an unhashable constexpr or option
        return _triton_path(fn, grid, args, kwargs, rec)
    if kernel is None:
        kernel = fn[grid](*args, **kwargs)
        if kernel is not None:
            kernels[key] = kernel
        if rec is not None:
            rec.launched(kernel, grid, values)
        return
    if rec is not None:
        rec.launched(kernel, grid, values)
    # what JITFunction.run then does: the launcher with the grid, the current stream, no
    # launch metadata and no hooks (None: the launcher skips them), every parameter's value
    kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
               get_stream(device), kernel.function, kernel.packed_metadata, None, None, None,
               *values)

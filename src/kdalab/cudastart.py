"""CUDA's start, begun while torch imports.

A CUDA process's first kernel waits for the driver (``cuInit``) and the device's primary
context: about 0.3 s on the H200 host, after torch's import of about 3 s. Both are driver calls
that torch's runtime would make anyway, and ctypes releases the GIL while a foreign function
runs, so a thread can make them while the main thread imports torch; torch then finds the
primary context made and retains it too (docs/sweeps.md, "Helper processes"; measured in
docs/BENCHMARKS.md). Imports nothing of kdalab's or torch's.

What runs is only ``cuInit(0)``, ``cuDeviceGet`` and ``cuDevicePrimaryCtxRetain``, the same
context, with its default flags, that torch, CuPy and Triton use: nothing a kernel computes
depends on it. Any failure (no driver, no such device) is silent and leaves CUDA's start to
torch, as without it.
"""

from __future__ import annotations

import ctypes
import re
import threading

__all__ = ["start", "ordinal"]

_THREAD: threading.Thread | None = None


def ordinal(device: str | None) -> int | None:
    """The CUDA device index of a ``--device`` value (``cuda`` → 0, ``cuda:N`` → N), else
    None (CPU, or not a device's name: the options' own checks say what is wrong)."""
    match = re.fullmatch(r"\s*cuda(?::(\d+))?\s*", device or "")
    if match is None:
        return None
    return int(match.group(1) or 0)


def _retain(index: int) -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return
        dev = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return
        # retained for the process's life: torch retains the same context and keeps it
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctypes.c_void_p()), dev)
    except (OSError, AttributeError):  # no driver here: torch says so, if CUDA is used
        pass


def start(device: str | None) -> bool:
    """Begin CUDA's start for ``device`` (a ``--device`` value) on a daemon thread; False if it
    names no CUDA device or it has begun already. Call it before importing torch."""
    global _THREAD
    index = ordinal(device)
    if index is None or _THREAD is not None:
        return False
    _THREAD = threading.Thread(target=_retain, args=(index,), name="kdalab-cuda-start",
                               daemon=True)
    _THREAD.start()
    return True

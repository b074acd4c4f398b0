"""``KDALAB_TIMELINE=1``: where a command's time goes, as marks on stderr (docs/sweeps.md).
Imports nothing of kdalab's: any layer may mark its phases."""

from __future__ import annotations

import os
import sys
import time

__all__ = ["mark", "on", "OFF"]

_IMPORTED = time.perf_counter()


def _since_start() -> float:
    """Seconds since this process started (Linux: from /proc, 10 ms ticks; elsewhere since
    this module was imported)."""
    try:
        with open("/proc/self/stat") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _IMPORTED


#: the values of ``KDALAB_TIMELINE`` that leave it off (as unset)
OFF = ("", "0", "false", "no", "off")


def on() -> bool:
    """Whether ``KDALAB_TIMELINE`` asks for the marks: set to anything but 0, false, no, off
    or nothing."""
    return os.environ.get("KDALAB_TIMELINE", "").strip().lower() not in OFF


def mark(what: str) -> None:
    """With ``KDALAB_TIMELINE`` on (:func:`on`), ``timeline <seconds since the process started>
    <what>`` on stderr: where a command's time goes (docs/sweeps.md)."""
    if on():
        print(f"timeline {_since_start():7.3f} s  {what}", file=sys.stderr, flush=True)

"""Helper processes: a Python child started early, serving requests in order over its pipes.

A command's heavy imports (torch: 3–4 s on the H200 host; pandas and matplotlib: about 1 s) run
one after the other in one interpreter. A helper started as the command begins imports what its
job needs *meanwhile*, on another core, and then serves requests (pickled, answered in the order
they were sent): the draw servers (:mod:`kdalab.experiments.drawserver`) and the views worker
(:mod:`kdalab.views.worker`). A helper never touches CUDA, ignores ^C (the command's error
boundary handles it and closes the helpers) and ends when its stdin closes; if one dies or
fails, its caller does the work itself, so a helper changes when work is done, never what.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable

__all__ = ["Helper", "HelperError", "serve", "close_all", "start_early", "take_early",
           "draw_servers", "DRAW_SERVER", "VIEWS_WORKER"]

#: The helpers kdalab starts (modules run with ``python -m``).
DRAW_SERVER = "kdalab.experiments.drawserver"
VIEWS_WORKER = "kdalab.views.worker"


def draw_servers() -> int:
    """Draw servers for this machine: 3 from 8 cores, 2 from 5, else none (the sweep's own
    process, its store's writer and the views worker keep the rest)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return 3 if cores >= 8 else 2 if cores >= 5 else 0


class HelperError(RuntimeError):
    """A helper died, could not start, or failed a request (its traceback in the message)."""


class Helper:
    """A child process running ``python -m module`` (whose ``__main__`` calls :func:`serve`)."""

    def __init__(self, module: str) -> None:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   KDALAB_TIMELINE="")  # no CUDA; small tensors, one thread
        self.module = module
        self._ready = False
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          env=env)
        except OSError as exc:
            raise HelperError(f"{module} did not start: {exc}") from exc

    def send(self, *request) -> None:
        """Queue a request (answered by :meth:`receive`, in order)."""
        try:
            pickle.dump(request, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise HelperError(f"{self.module} is gone ({exc})") from exc

    def receive(self):
        """The answer to the oldest request not yet received (waits for it)."""
        if not self._ready:  # the helper says so once its imports are done
            self._take_ready()
        try:
            status, value = pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
            raise HelperError(f"{self.module} died (exit {self._proc.poll()})") from exc
        if status != "ok":
            raise HelperError(f"{self.module} failed:\n{value}")
        return value

    def ready(self) -> bool:
        """Whether the helper has finished its imports and serves (never waits); raises
        :class:`HelperError` if it died."""
        if not self._ready:
            import select

            if not select.select([self._proc.stdout], [], [], 0)[0]:
                return False
            self._take_ready()  # one small message, written at once: all here when any is
        return True

    def _take_ready(self) -> None:
        """Read the helper's ``ready`` (waits for it)."""
        try:
            said = pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
            raise HelperError(f"{self.module} died (exit {self._proc.poll()})") from exc
        if said != ("ready",):
            raise HelperError(f"{self.module} did not say it was ready")
        self._ready = True

    def request(self, *request):
        self.send(*request)
        return self.receive()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self, wait: bool = True, kill: bool = False) -> None:
        """End the helper: its stdin closed, on which it leaves at once (:func:`serve`);
        killed if it has not within 2 s. ``wait=False``: only close its stdin (then
        :meth:`close` again to reap it). ``kill``: end it at once (a helper never used may
        still be importing, and reads its stdin only then)."""
        if kill and self._proc.poll() is None:
            self._proc.kill()
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        if not wait:
            return
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()


def close_all(helpers: list[Helper], kill: bool = False) -> None:
    """End ``helpers`` together (each told first, then each reaped; ``kill``: at once)."""
    for helper in helpers:
        helper.close(wait=False, kill=kill)
    for helper in helpers:
        helper.close()


_EARLY: dict[str, list[Helper]] = {}  # module -> helpers started, not yet taken


def start_early(module: str, count: int = 1) -> None:
    """Start ``count`` helpers of ``module`` now, for :func:`take_early` (a command does this
    first, so that they import while it does). Those never taken end with this process."""
    if count < 1 or module in _EARLY:
        return
    try:
        _EARLY[module] = [Helper(module) for _ in range(count)]
    except HelperError:
        _EARLY.pop(module, None)


def take_early(module: str) -> list[Helper]:
    """The helpers of ``module`` started early (the caller closes them); [] if none."""
    return _EARLY.pop(module, [])


@atexit.register
def _close_early() -> None:  # started, never used (a mistake in the options): killed
    close_all([h for helpers in _EARLY.values() for h in helpers], kill=True)
    _EARLY.clear()


def serve(handle: Callable) -> None:
    """A helper's loop: say ``ready``, then answer each request ``handle(*request)`` until stdin
    closes. Called by the helper module's ``__main__`` after its imports."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the command's to handle
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed may reach the protocol's pipe
    pickle.dump(("ready",), out)
    out.flush()
    while True:
        try:
            request = pickle.load(inp)
        except (EOFError, OSError):  # the command is done with this helper: leave at once,
            os._exit(0)  # without tearing torch or matplotlib down (0.5 s on the H200 host)
        try:
            answer = ("ok", handle(*request))
        except Exception:  # noqa: BLE001 (sent back: the caller raises it)
            answer = ("error", traceback.format_exc())
        try:
            pickle.dump(answer, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        except (OSError, ValueError):
            os._exit(0)

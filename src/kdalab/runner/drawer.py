"""``--backend drawer``: the local backend with a batch's inputs drawn in a second process.

The drawer is a spawned Python process, started as the command starts (:func:`start`), so that
its import of torch runs while the command imports its own. It then runs the calls it is sent
in order, a few batches ahead of the command (:meth:`Drawer.ahead`), and sends each result back
(tensors through shared memory). The command's thread is left the GPU's work and the records,
which a draw-ahead thread shares with the draws under the GIL. docs/sweeps.md has the figures
that decide whether it stays.

Only calls and their results cross: the records are the plain local backend's, bit for bit.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator

__all__ = ["Drawer", "start", "DEPTH"]

#: batches drawn ahead of the one the command computes (bounds the drawer's memory)
DEPTH = 4

_STARTED: Drawer | None = None


def _serve(requests, results, preload: tuple[str, ...]) -> None:
    """The drawer process: import torch and ``preload`` at once, then ``fn(*args)`` for each
    request, in order, until the command closes its end."""
    import importlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the command's to report; we end on EOF
    import torch
    import torch.multiprocessing  # noqa: F401  (tensors go back through shared memory)

    torch.set_num_threads(1)  # small tensors: one thread, as the command's draws
    for module in preload:
        importlib.import_module(module)
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return
        fn, args = request
        try:
            results.send((True, fn(*args)))
        except BaseException as exc:  # said in the command, which raises it
            results.send((False, exc))


class Drawer:
    """One drawer process and its two pipes (requests in, results out)."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")  # no copy of a process holding CUDA
        their_requests, self._requests = ctx.Pipe(duplex=False)
        self._results, their_results = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_serve,
                                    args=(their_requests, their_results, tuple(preload)),
                                    name="kdalab-drawer", daemon=True)
        self._process.start()
        their_requests.close()  # the process alone holds them: it sees EOF when we leave
        their_results.close()

    def ahead(self, calls: Iterable[tuple]) -> Iterator[tuple]:
        """``(item, fn(*args))`` for each ``(item, fn, args)`` of ``calls``, in order, with up
        to :data:`DEPTH` calls sent ahead. An exception in a call is raised here."""
        calls = iter(calls)
        sent: deque = deque()

        def send() -> None:
            call = next(calls, None)
            if call is not None:
                item, fn, args = call
                self._requests.send((fn, args))
                sent.append(item)

        try:
            for _ in range(DEPTH):
                send()
            while sent:
                try:
                    ok, result = self._results.recv()
                except (EOFError, OSError):
                    raise RuntimeError("the drawer process ended before its draws "
                                       f"(exit code {self._process.exitcode})") from None
                if not ok:
                    raise result
                item = sent.popleft()
                send()
                yield item, result
        finally:
            if sent:  # results still on their way: this drawer is out of step, so it goes
                self.close()

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self) -> None:
        global _STARTED
        self._requests.close()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.terminate()
        if _STARTED is self:
            _STARTED = None


def start(preload: tuple[str, ...] = ()) -> Drawer:
    """The command's drawer, started now if it is not running (call it first thing: its
    imports, torch's and ``preload``'s, e.g. the module of the draws, overlap the command's)."""
    global _STARTED
    if _STARTED is None or not _STARTED.alive:
        _STARTED = Drawer(preload)
    return _STARTED

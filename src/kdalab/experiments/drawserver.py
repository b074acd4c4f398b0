"""Draw servers: a large CUDA sweep's input draws in helper processes, started as the command
begins, so that they import torch while it does and then draw beside it.

In one process a sweep's draws (CPU work: a few torch calls per seed and batch) and its GPU
queueing and records take turns on the interpreter lock; on the H200 host the 94,500-run
sweep's draws alone took 1.4–1.9 s of its 3.1–3.3 s (docs/BENCHMARKS.md). :class:`DrawServers`
runs them in ``processes`` helpers (:mod:`kdalab.experiments.helper`): seed ``s`` is always
drawn by server ``s mod processes``, so each server's key streams
(:mod:`kdalab.experiments.keystream`) serve its seeds at every chunk size. A batch is sent to
every server at once (its runs split by seed), each writes its runs' inputs, drawn by the same
:func:`~kdalab.experiments.draw.make_inputs_batch`, into their rows of one shared-memory
block, which on CUDA is page-locked once (``cudaHostRegister``) so that the batch goes to the
GPU straight from it, with no copy here. Two batches are in flight, so the servers draw the
next while this process queues the GPU's work. If a server fails, the draws come back to this
process: the inputs are the same bits either way (tests/test_helpers.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from kdalab.experiments.draw import ChunkInputs, make_inputs_batch
from kdalab.experiments.families import FAMILIES
from kdalab.experiments.helper import DRAW_SERVER, Helper, HelperError, close_all, take_early
from kdalab.experiments.runs import Run

__all__ = ["DrawServers", "take", "MIN_RUNS"]

#: Below this many runs a sweep draws in its own process (and closes servers started early).
MIN_RUNS = 20_000
#: On CUDA, page-lock the shared blocks so that the GPU copies the draws straight from them
#: (else each batch is copied here into page-locked memory first)
PAGE_LOCK = True


def _layout(n: int, chunk: int, dim: int) -> tuple[int, int]:
    """Bytes of keys [n, C, D] bfloat16 (padded to 8) and of each float64 [n, C] tensor."""
    kb = n * chunk * dim * 2
    return kb + (-kb) % 8, n * chunk * 8


def _views(buf: torch.Tensor, n: int, chunk: int, dim: int):
    """keys [n, C, D], log_decay and beta [n, C] laid out in the uint8 tensor ``buf``."""
    kb, fb = _layout(n, chunk, dim)
    keys = buf[:kb].view(torch.bfloat16)[: n * chunk * dim].view(n, chunk, dim)
    log_decay = buf[kb : kb + fb].view(torch.float64).view(n, chunk)
    beta = buf[kb + fb : kb + 2 * fb].view(torch.float64).view(n, chunk)
    return keys, log_decay, beta


class _Block:
    """A shared-memory block of this process, attached by the servers by name. On CUDA it is
    page-locked (the GPU copies from it directly) and remembers the copies made from it:
    :meth:`wait` before the servers write into it again."""

    def __init__(self, nbytes: int, cuda: bool = False) -> None:
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=max(nbytes, 1 << 20))
        self.buf = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self.locked = cuda and PAGE_LOCK and int(torch.cuda.cudart().cudaHostRegister(
            self.buf.data_ptr(), self.buf.numel(), 0)) == 0
        self.copied: torch.cuda.Event | None = None

    def wait(self) -> None:
        """Until the GPU has copied what it was asked to from this block."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None

    def free(self) -> None:
        self.wait()
        if self.locked:
            torch.cuda.cudart().cudaHostUnregister(self.buf.data_ptr())
        del self.buf
        self.shm.close()
        self.shm.unlink()


@dataclass
class _Pending:
    runs: list
    block: _Block | None  # None: drawn here when its result is asked for


class DrawServers:
    """Draw servers (see the module), each a :class:`~kdalab.experiments.helper.Helper` of
    this module: :meth:`submit` a batch's runs, then take its :meth:`result` (in submission
    order). For one sweep: :meth:`close` after it."""

    def __init__(self, helpers: list[Helper], cuda: bool = False) -> None:
        self._helpers = helpers
        self._cuda = cuda  # blocks page-locked, results copied to the GPU from them
        self._free: list[_Block] = []
        self._blocks: list[_Block] = []
        self._pending: deque[_Pending] = deque()
        self.failed: str | None = None
        self.served = 0  # batches drawn by the servers

    def __len__(self) -> int:
        return len(self._helpers)

    def ready(self) -> bool:
        """Whether every server has finished its imports (never waits). A server that died
        stops the servers' use, as in :meth:`submit` (False from then on)."""
        if self.failed is not None:
            return False
        try:
            return all([helper.ready() for helper in self._helpers])
        except HelperError as exc:
            self._fail(exc)
            return False

    def submit(self, runs: list) -> None:
        if self.failed is not None:
            self._pending.append(_Pending(runs, None))
            return
        n, chunk, dim = len(runs), runs[0].chunk, runs[0].dim
        kb, fb = _layout(n, chunk, dim)
        block = self._block(kb + 2 * fb)
        seeds = np.fromiter((r.seed for r in runs), np.int64, n) % len(self._helpers)
        try:
            for server, helper in enumerate(self._helpers):
                rows = np.flatnonzero(seeds == server)  # this server's runs: their rows
                helper.send(block.shm.name, n, chunk, dim, rows,
                            _packed([runs[i] for i in rows.tolist()]))
        except HelperError as exc:
            self._fail(exc)
            self._free.append(block)
            self._pending.append(_Pending(runs, None))
            return
        self._pending.append(_Pending(runs, block))

    def _block(self, nbytes: int) -> _Block:
        """A free block of at least ``nbytes``; a new one is twice as large as asked (a
        sweep's batches grow with the chunk size), and smaller free ones are let go."""
        block = next((b for b in self._free if b.shm.size >= nbytes), None)
        if block is not None:
            self._free.remove(block)
            block.wait()  # the GPU's copy of its last batch is done
            return block
        for small in self._free:
            self._blocks.remove(small)
            small.free()
        self._free.clear()
        block = _Block(2 * nbytes, self._cuda)
        self._blocks.append(block)
        return block

    def result(self, device: torch.device) -> ChunkInputs:
        """The inputs of the oldest batch submitted, on ``device``: bit for bit
        ``make_inputs_batch(runs, device)``."""
        p = self._pending.popleft()
        if p.block is not None and self.failed is None:
            try:
                for helper in self._helpers:
                    helper.receive()
            except HelperError as exc:
                self._fail(exc)
        if p.block is None or self.failed is not None:
            if p.block is not None:
                self._free.append(p.block)
            return make_inputs_batch(p.runs, device)
        n, chunk, dim = len(p.runs), p.runs[0].chunk, p.runs[0].dim
        drawn = _views(p.block.buf, n, chunk, dim)
        if p.block.locked and device.type == "cuda":  # straight from the block, no copy here
            out = [x.to(device, non_blocking=True) for x in drawn]
            p.block.copied = torch.cuda.Event()
            p.block.copied.record(torch.cuda.current_stream(device))
        else:  # a copy here (page-locked for the GPU): the block is written again
            pin = device.type == "cuda"
            out = []
            for x in drawn:
                t = torch.empty(x.shape, dtype=x.dtype, pin_memory=pin)
                t.copy_(x)
                out.append(t.to(device, non_blocking=True) if pin else t)
        self._free.append(p.block)
        self.served += 1
        return ChunkInputs(*out)

    def _fail(self, exc: HelperError) -> None:
        """Stop using the servers: every batch from now on is drawn in this process."""
        self.failed = str(exc)
        close_all(self._helpers, kill=True)

    def close(self, kill: bool = False) -> None:
        """End the servers (``kill``: at once, e.g. never used) and free the blocks."""
        close_all(self._helpers, kill=kill)
        for block in self._blocks:
            block.free()
        self._blocks.clear()
        self._free.clear()


def take(cuda: bool = False) -> DrawServers | None:
    """The draw servers a command started early (:func:`~kdalab.experiments.helper.start_early`
    of :data:`~kdalab.experiments.helper.DRAW_SERVER`), or None; ``cuda``: for a sweep on
    CUDA (its blocks page-locked)."""
    helpers = take_early(DRAW_SERVER)
    return DrawServers(helpers, cuda) if helpers else None


def _packed(runs: list) -> tuple:
    """Runs as a few flat arrays (pickled in microseconds, where a list of tuples takes ms)."""
    codes = {name: i for i, name in enumerate(FAMILIES)}
    return (np.fromiter((codes[r.family] for r in runs), np.int8, len(runs)),
            np.fromiter((r.seed for r in runs), np.int64, len(runs)),
            np.fromiter((np.nan if r.lower_bound is None else r.lower_bound for r in runs),
                        np.float64, len(runs)))


def _unpacked(packed: tuple, chunk: int, dim: int) -> list[Run]:
    names = list(FAMILIES)
    return [Run(names[f], None if lb != lb else lb, chunk, s, dim)
            for f, s, lb in zip(packed[0].tolist(), packed[1].tolist(), packed[2].tolist())]


# --- in the server -------------------------------------------------------------------------

_ATTACHED: dict = {}  # name -> (SharedMemory, uint8 tensor)


def _attach(name: str) -> torch.Tensor:
    if name not in _ATTACHED:
        from multiprocessing import resource_tracker, shared_memory

        shm = shared_memory.SharedMemory(name=name)
        try:  # the parent owns the block: this process must not unlink it at its exit
            resource_tracker.unregister(shm._name, "shared_memory")
        except Exception:  # noqa: BLE001
            pass
        _ATTACHED[name] = (shm, torch.frombuffer(shm.buf, dtype=torch.uint8))
    return _ATTACHED[name][1]


def _draw(block: str, n: int, chunk: int, dim: int, rows, packed: tuple) -> int:
    """A server's request: the inputs of the runs ``packed`` into their ``rows`` of the batch's
    block."""
    runs = _unpacked(packed, chunk, dim)
    if runs:
        drawn = make_inputs_batch(runs)
        index = torch.from_numpy(rows)
        for out, x in zip(_views(_attach(block), n, chunk, dim),
                          (drawn.keys, drawn.log_decay, drawn.beta)):
            out.index_copy_(0, index, x)
    return len(runs)


if __name__ == "__main__":
    from kdalab.experiments.helper import serve

    torch.set_num_threads(1)
    serve(_draw)

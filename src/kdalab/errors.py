"""kdalab's own exceptions. The module imports nothing but the standard library, so the command
line can name them without loading torch.

Bad arguments raise ``ValueError`` naming the argument (see :mod:`kdalab.params`); a request this
machine cannot serve (a model that needs CUDA, CuPy not installed) raises :class:`Unavailable`.
Both are expected failures: the command line reports them in one line and exits with code 2, as
it does for every :class:`KdalabError` (the boundary in :mod:`kdalab.cli`).
"""

import signal

__all__ = ["KdalabError", "Unavailable", "Interrupted"]


class KdalabError(Exception):
    """An expected failure that is not a bad argument; the command line says it in one line."""


class Unavailable(KdalabError, RuntimeError):
    """What was asked for needs something this machine does not have (a CUDA device, CuPy)."""


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) or SIGTERM (``kill``, ``timeout``, a job scheduler): raised by the command
    line's handlers, or by a layer that sees it happen elsewhere (a worker process stopped by
    the signal), instead of KeyboardInterrupt, which the command framework would turn into a
    silent exit 130. A BaseException, so that ``except Exception`` lets it through to the
    boundary, which says what was kept and exits with 128 + ``signum`` (130, 143)."""

    def __init__(self, signum: int = signal.SIGINT, message: str = ""):
        super().__init__(message or signum)
        self.signum = int(signum)

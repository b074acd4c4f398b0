"""kdalab's own exceptions. The module imports nothing, so the command line can name them without
loading torch.

Bad arguments raise ``ValueError`` naming the argument (see :mod:`kdalab.params`); a request this
machine cannot serve (a model that needs CUDA, CuPy not installed) raises :class:`Unavailable`.
Both are expected failures: the command line reports them in one line and exits with code 2, as
it does for every :class:`KdalabError` (the boundary in :mod:`kdalab.cli`).
"""

__all__ = ["KdalabError", "Unavailable"]


class KdalabError(Exception):
    """An expected failure that is not a bad argument; the command line says it in one line."""


class Unavailable(KdalabError, RuntimeError):
    """What was asked for needs something this machine does not have (a CUDA device, CuPy)."""

"""kdalab's own exception for what a machine lacks. It imports nothing, so the command line can
name it without loading torch.

Bad arguments raise ``ValueError`` naming the argument (see :mod:`kdalab.params`); a request this
machine cannot serve (a model that needs CUDA, CuPy not installed) raises :class:`Unavailable`.
Both are expected failures: the command line reports them in one line and exits with code 2.
"""

__all__ = ["Unavailable"]


class Unavailable(RuntimeError):
    """What was asked for needs something this machine does not have (a CUDA device, CuPy)."""

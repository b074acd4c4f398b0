"""kdalab: the numerics of chunked Kimi Delta Attention (see README.md).

``kdalab.__version__`` is the installed distribution's version, which the build takes from git
(hatch-vcs: the last tag, the commits since and the commit itself), so every commit names a
different version.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("kdalab")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]

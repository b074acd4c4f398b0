"""kdalab's command line. Each command lives in its own module and registers on ``app``."""

from __future__ import annotations

import sys

# Command modules register themselves on import.
from kdalab.cli import (
    check,  # noqa
    dynamic_range,  # noqa
    end_to_end,  # noqa
    reproduce,  # noqa: E402,F401
    sweep,  # noqa: F401
)
from kdalab.cli.app import app, run_app  # noqa: F401


def main() -> None:
    """Entry point: any ValueError escaping a command becomes a one-line message and exit code 2."""
    try:
        app(standalone_mode=True)
    except ValueError as exc:  # validation errors from the library layers
        from kdalab.cli.app import err_console

        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)

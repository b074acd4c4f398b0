"""The typer application and its error handling; command modules register on ``app``/``run_app``."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="kdalab",
    help="Numerics of chunked Kimi Delta Attention: experiments, calculators and kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
run_app = typer.Typer(
    help="Run one of kdalab's studies (records, tables and plots in an output folder).",
    no_args_is_help=True,
)
app.add_typer(run_app, name="run")

console = Console()
err_console = Console(stderr=True)


class UsageError(Exception):
    """Bad command-line input: printed as one message, exit code 2, no traceback."""


def fail(message: str) -> None:
    """Print ``message`` as a usage error and exit with code 2."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code=2)

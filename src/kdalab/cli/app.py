"""The typer application: ``app`` and ``run_app`` (the studies), the consoles, ``--version`` and
``--debug``, and what a command leaves for the error boundary to say on an interrupt.

Command modules register on ``app`` / ``run_app`` and import nothing heavy at module level (no
torch, numpy, pandas or matplotlib): ``--help``, ``--version`` and a mistake in the options
answer without loading them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich.console import Console

from kdalab.errors import Interrupted
from kdalab.timeline import mark

__all__ = ["app", "run_app", "console", "err_console", "prose", "STATE", "version", "Interrupted",
           "OutputClosed", "mark"]


class OutputClosed(BaseException):
    """The reader of stdout went away (``kdalab … | head``), raised instead of BrokenPipeError
    so that it reaches the error boundary (the command framework turns that into exit 1)."""


#: what an interrupted command kept, and how to go on (set by the commands, said by the boundary)
@dataclass
class State:
    debug: bool = False
    kept: list[str] = field(default_factory=list)
    resume: str = ""


STATE = State()


def prose(text: str) -> str:
    """A docstring as help text: paragraphs reflowed (the terminal wraps them), not the source's
    line breaks."""
    paragraphs = textwrap.dedent(text).strip().split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version("kdalab")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"kdalab {version()}")
        raise typer.Exit()


app = typer.Typer(
    name="kdalab",
    help=prose("""Numerics of chunked Kimi Delta Attention: the seed document's experiment
    (reproduce, sweep), studies (run), the safe-chunk calculator and Triton kernels."""),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # click's plain help: it reflows paragraphs to the terminal and needs no Markdown renderer
    # (rich's help panels cost imports and drawing on every --help)
    rich_markup_mode=None,
)
run_app = typer.Typer(
    help="Run one of kdalab's studies (records, tables and plots in an output folder).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(run_app, name="run")


@app.callback()
def _root(
    version_: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print kdalab's version and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help="Show the full traceback of any error, expected or not.")] = False,
) -> None:
    STATE.debug = debug


console = Console()  # writes to sys.stdout as it is at each print (the boundary guards it)
err_console = Console(stderr=True)

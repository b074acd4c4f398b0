"""kdalab's command line, and its one error boundary (:func:`main`).

Every expected failure ends in one line on stderr, ``error: <what, which argument, what is
accepted>``, and exit code 2: a bad option, value, path or config file (``ValueError`` from
:mod:`kdalab.params`, click's usage errors) and a request this machine cannot serve
(:class:`kdalab.errors.Unavailable`). Ctrl-C says what was kept and how to go on, exit code 130.
A closed output pipe (``kdalab … | head``) ends quietly. Anything else is a bug: its traceback is
shown, exit code 1. ``--debug`` shows the traceback of every error.

Each command lives in its own module and registers on ``app`` when imported here.
"""

from __future__ import annotations

import os
import signal
import sys

from kdalab.cli import (  # noqa: F401  (each command module registers on app)
    check,
    dynamic_range,
    end_to_end,
    hunt,
    reproduce,
    sweep,
)
from kdalab.cli.app import (  # noqa: F401
    STATE,
    Interrupted,
    OutputClosed,
    app,
    err_console,
    mark,
    run_app,
)

__all__ = ["main", "run", "app"]


def _click_exceptions():
    """click's exceptions: vendored by typer >= 0.26 (typer._click), click's own before."""
    try:
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:  # an older typer, on click itself (a device with its own packages)
        from click.exceptions import ClickException

        try:
            from click.exceptions import NoArgsIsHelpError
        except ImportError:  # click < 8.2 shows the help itself and exits 0

            class NoArgsIsHelpError(ClickException):
                pass

    return ClickException, NoArgsIsHelpError


def _on_sigint(signum, frame):
    raise Interrupted()


class _GuardedStdout:
    """stdout with a closed pipe raised as :class:`OutputClosed`, which the command framework
    lets through (a BrokenPipeError it would turn into exit code 1)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise OutputClosed() from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise OutputClosed() from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {_one_line(message)}", highlight=False,
                      soft_wrap=True, markup=True)


def main(argv: list[str] | None = None, *, leave_now: bool = False) -> None:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``) and exit (SystemExit;
    with ``leave_now``, the process ends at once: :func:`_leave`)."""
    from kdalab.errors import Unavailable

    ClickException, NoArgsIsHelpError = _click_exceptions()
    args = sys.argv[1:] if argv is None else list(argv)
    mark("command line read")
    STATE.debug = "--debug" in args
    STATE.kept.clear()
    STATE.resume = ""
    previous = signal.signal(signal.SIGINT, _on_sigint)
    code, closed = 0, False
    real_stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        result = app(args=args, prog_name="kdalab", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except NoArgsIsHelpError as exc:  # plain `kdalab` or `kdalab run`: the help, not an error
        print(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
    except ClickException as exc:  # click's own: unknown option, bad type, missing value
        hint = f" (see '{exc.ctx.command_path} --help')" if getattr(exc, "ctx", None) else ""
        _error(exc.format_message() + hint)
        code = exc.exit_code if exc.exit_code else 2
    except (ValueError, Unavailable) as exc:
        if STATE.debug:
            err_console.print_exception()
        _error(str(exc))
        code = 2
    except Interrupted:
        if STATE.debug:
            err_console.print_exception()
        kept = "; ".join(STATE.kept) if STATE.kept else "nothing was written"
        how = f"; {STATE.resume}" if STATE.resume else ""
        err_console.print(f"interrupted: {kept}{how}", highlight=False, soft_wrap=True)
        code = 130
    except (OutputClosed, BrokenPipeError):
        closed = True  # the reader went away (`kdalab … | head`): stop writing, quietly
        code = 0
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.stdout = real_stdout
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        closed = True
    if closed:  # nothing more may reach the pipe, not even Python's flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    mark(f"exit {code}")
    if leave_now:
        _leave(code)
    sys.exit(code)


def _leave(code: int) -> None:
    """Exit without tearing the interpreter down: once the output is flushed and every file
    closed, Python's finalization (each module of torch, pandas and matplotlib, CUDA's
    context) only costs time: 0.6 s after ``import torch`` alone, 1.2 s after a sweep on the
    dev VM, 1 s on the H200 host (docs/BENCHMARKS.md). The atexit handlers still run (Ray's
    shutdown, multiprocessing's cleanup). Returns (for a normal exit) if a thread that Python
    would wait for is still running."""
    import atexit
    import threading

    if any(t.is_alive() and not t.daemon and t is not threading.main_thread()
           for t in threading.enumerate()):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def run() -> None:
    """The ``kdalab`` script and ``python -m kdalab``: :func:`main`, leaving the process at
    once when it is done (:func:`_leave`)."""
    main(leave_now=True)

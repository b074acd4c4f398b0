"""kdalab's command line, and its one error boundary (:func:`main`).

What a command does, and what the boundary makes of it (every command, ``check`` included):

* **A mistake** — a bad option, value, path or config key, a request this machine cannot
  serve: the command *raises* ``ValueError`` (the validators of :mod:`kdalab.params` raise it,
  naming the argument as the user wrote it: ``--seeds``, ``sweep.toml: out``) or a
  :mod:`kdalab.errors` type (:class:`~kdalab.errors.Unavailable`); click's usage errors (an
  unknown option, a missing value, a wrong type) arrive the same way, and so does an
  ``OSError`` about a file (permission denied, no space left). The boundary prints one line on
  stderr, ``error: <message>``, and exits with code 2. A command never prints its own
  ``error:`` line and never exits by itself for a mistake.
* **A verdict** — ``check`` finding a failing case: the command returns the exit code (an int)
  or raises ``typer.Exit(code)``; the boundary exits with it.
* **Ctrl-C and SIGTERM** — SIGINT and SIGTERM (``kill``, ``timeout``, a job scheduler) raise
  :class:`~kdalab.cli.app.Interrupted` (a BaseException) wherever the command is: the handlers
  are installed here, once, for every command; commands do not install their own, nor catch
  Interrupted or KeyboardInterrupt to report it. A command that writes
  wraps its writing in ``try: … except BaseException:`` that appends to ``STATE.kept`` one phrase
  per thing kept (``"20 of 54 records kept in out"``), sets ``STATE.resume`` to how to go
  on (``"'kdalab check --redraw --out out' draws the report from them"``), and re-raises:
  :func:`kdalab.cli.stored.run_into_folder` does it for a study's store, ``kdalab check`` and
  ``kdalab hunt`` for their own. The boundary prints
  ``interrupted: <STATE.kept joined by '; '>; <STATE.resume>`` (``terminated:`` for SIGTERM)
  and exits with code 130 (SIGTERM: 143); when a command declared nothing it says
  ``interrupted: nothing was kept``, so a command that writes must declare what it kept.
* **Out of memory** (a MemoryError, torch's failed allocation on the CPU or the GPU): one
  ``error:`` line saying how much was asked for, exit code 2.
* **A closed stdout** (``kdalab … | head``) ends quietly, exit code 0.
* **Anything else is a bug**: its traceback, exit code 1. ``--debug`` shows the traceback of
  every error.

The boundary also expands ``~`` in every argument that starts with it (``--out '~/x'`` and
``--out=~/x``, which the shell leaves alone; TOML values are expanded by :mod:`kdalab.params`),
reads ``--redraw PATH`` as ``--redraw --out PATH`` for every command (:func:`_redraw_folder`),
and when stdout or stderr is not a terminal (a pipe, a CI log) it never folds a line at the
console's width, so paths stay whole.

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
    inverse_stability,
    reproduce,
    sweep,
)
from kdalab.cli.app import (  # noqa: F401
    STATE,
    Interrupted,
    OutputClosed,
    app,
    console,
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


#: the signals that stop a command cleanly, and the word the boundary says for each
STOPPING = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _on_stop(signum, frame):
    raise Interrupted(signum)


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


#: the options whose value is a path: click reads empty text as the path '.', so the
#: command could not tell ``--out ''`` from ``--out .``
PATH_OPTIONS = ("--out", "--redraw", "--inputs")


def _expand_home(args: list[str]) -> list[str]:
    """``~`` expanded where an argument or an ``--option=`` value starts with it; a ``~user``
    that names no user here, or an empty value of a path option (:data:`PATH_OPTIONS`), is a
    ValueError naming the option."""
    out = []
    for i, arg in enumerate(args):
        option, value = (args[i - 1] if i and args[i - 1].startswith("-") else "argument"), arg
        if arg.startswith("--") and "=" in arg:
            option, _, value = arg.partition("=")
            if not value.startswith("~") and value.strip():
                option, value = "argument", arg
        if option in PATH_OPTIONS and not value.strip():
            raise ValueError(f"{option} is empty; expected a path")
        if value.startswith("~"):
            home = os.path.expanduser(value)
            if home.startswith("~"):
                user = value[1:].partition("/")[0]
                raise ValueError(f"{option}: cannot expand {value!r}: no user {user!r} here (~ "
                                 "alone is your home folder)")
            arg = home if value is arg else f"{option}={home}"
        out.append(arg)
    return out


def _redraw_folder(args: list[str]) -> list[str]:
    """Every command with a store takes its folder alike, ``--redraw --out PATH``; the short
    forms ``--redraw=PATH`` and ``--redraw PATH`` are read as that, PATH an existing folder, or
    a path that does not exist when no ``--out`` is given (an existing file is a config file,
    and beside an ``--out`` a word is an argument: a kernel). A folder named both ways is a
    ValueError."""
    has_out = any(a == "--out" or a.startswith("--out=") for a in args)
    out, folded = [], False
    i = 0
    while i < len(args):
        arg, after = args[i], args[i + 1] if i + 1 < len(args) else None
        if arg == "--":  # what follows is no option
            out += args[i:]
            break
        if arg.startswith("--redraw="):
            out += ["--redraw", "--out", arg.partition("=")[2]]
            folded = True
        elif arg == "--redraw" and after is not None and not after.startswith("-") and (
                os.path.isdir(after) or not (has_out or os.path.exists(after))):
            out += ["--redraw", "--out", after]
            folded, i = True, i + 1
        else:
            out.append(arg)
        i += 1
    if folded and has_out:
        raise ValueError("--redraw PATH and --out both name the folder: give it once, "
                         "'--redraw --out PATH'")
    return out


def _no_folding() -> None:
    """Consoles that do not write to a terminal never fold a line (rich folds at 80 columns
    when it cannot ask a terminal for its width)."""
    for c in (console, err_console):
        if not c.is_terminal:
            c.soft_wrap = True


def _os_message(exc: OSError) -> str:
    what = exc.strerror or str(exc)
    where = " -> ".join(repr(str(f)) for f in (exc.filename, exc.filename2) if f)
    return f"{what}: {where}" if where else what


def _out_of_memory(exc: BaseException) -> bool:
    """A request too large for this machine's memory (CPU or GPU), not a bug."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or (
        "can't allocate memory" in str(exc))


def _memory_message(exc: BaseException) -> str:
    import re

    size = re.search(r"allocate (\d+) bytes", str(exc)) or re.search(
        r"allocate ([\d.]+ [KMGT]iB)", str(exc))
    what = ""
    if size:
        n = size.group(1)
        what = f" (it asked for {int(n) / 2**30:.1f} GiB at once)" if n.isdigit() else (
            f" (it asked for {n} at once)")
    return (f"out of memory{what}: the request is too large for this machine; ask for smaller "
            "chunks, dims or fewer runs")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(_one_line(message))}", highlight=False,
                      soft_wrap=True, markup=True, emoji=False)  # ":-1:" stays as typed


def main(argv: list[str] | None = None, *, leave_now: bool = False) -> None:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``) and exit (SystemExit;
    with ``leave_now``, the process ends at once: :func:`_leave`)."""
    from kdalab.errors import KdalabError

    ClickException, NoArgsIsHelpError = _click_exceptions()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        args, unexpanded = _redraw_folder(_expand_home(args)), None
    except ValueError as exc:  # said by the boundary below, as any mistake
        unexpanded = exc
    _no_folding()
    mark("command line read")
    STATE.debug = "--debug" in args
    STATE.kept.clear()
    STATE.resume = ""
    previous = {signum: signal.signal(signum, _on_stop) for signum in STOPPING}
    code, closed = 0, False
    real_stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        if unexpanded is not None:
            raise unexpanded
        result = app(args=args, prog_name="kdalab", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except NoArgsIsHelpError as exc:  # plain `kdalab` or `kdalab run`: the help, not an error
        print(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
    except ClickException as exc:  # click's own: unknown option, bad type, missing value
        hint = f" (see '{exc.ctx.command_path} --help')" if getattr(exc, "ctx", None) else ""
        if "--redraw" in args and "unexpected extra argument" in exc.format_message():
            hint = " (--redraw takes the folder as '--redraw --out PATH')" + hint
        _error(exc.format_message() + hint)
        code = exc.exit_code if exc.exit_code else 2
    except (ValueError, KdalabError) as exc:
        if STATE.debug:
            err_console.print_exception()
        _error(str(exc))
        code = 2
    except (Interrupted, KeyboardInterrupt) as exc:
        if STATE.debug:
            err_console.print_exception()
        signum = getattr(exc, "signum", signal.SIGINT)
        kept = "; ".join(STATE.kept) if STATE.kept else "nothing was kept"
        how = f"; {STATE.resume}" if STATE.resume else ""
        err_console.print(f"{STOPPING.get(signum, 'interrupted')}: {kept}{how}",
                          highlight=False, soft_wrap=True, markup=False)
        code = 128 + signum
    except (OutputClosed, BrokenPipeError):  # before ConnectionError, BrokenPipeError's base
        closed = True  # the reader went away (`kdalab … | head`): stop writing, quietly
        code = 0
    except ConnectionError as exc:  # a Ray cluster (--address) or another server not reached
        if STATE.debug:
            err_console.print_exception()
        hint = ("; is a Ray cluster running there ('ray start --head'), or leave out --address"
                if any(a.startswith("--address") for a in args) else "")
        _error(f"cannot connect: {_os_message(exc)}{hint}")
        code = 2
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise  # a bug: its traceback
        if STATE.debug:
            err_console.print_exception()
        _error(_memory_message(exc))
        code = 2
    except OSError as exc:  # a file of the user's: permission denied, no space left, …
        if STATE.debug:
            err_console.print_exception()
        _error(_os_message(exc))
        code = 2
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
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
    context) only costs time, about a second after a sweep. The atexit handlers still run (Ray's
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

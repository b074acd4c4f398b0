"""Long work on stderr (stdout holds only results): a progress bar on a terminal, and plain lines
elsewhere (a log file, CI, ``nohup``), where a bar would print nothing or control characters;
and a spinner while views are drawn.

One class serves every command that works for long: :class:`WeightedProgress`, whose ETA is
weighted by each item's estimated cost (a study's runs differ 100× in cost; a check's cases are
counted; a hunt's budget is seconds)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from kdalab.cli.app import err_console

__all__ = ["WeightedProgress", "drawing", "PLAIN_EVERY_S"]

#: seconds between two plain progress lines (stderr not a terminal): often enough for a log to
#: show that the work goes on, seldom enough that an hour's run writes about a hundred lines
PLAIN_EVERY_S = 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class WeightedProgress:
    """Progress over ``total_weight`` cost units that also counts items (``noun``: runs, cells,
    cases, trials; ``total_items`` None when their number is not known in advance):
    ``advance(items, weight)`` after each piece of work, or ``update(done=…, items=…)`` with
    the totals so far; ``note`` says what is being done (the current case, the worst error so
    far). The ETA comes from the cost done per second, so cheap early runs do not promise an
    early end. On a terminal a bar (``what`` its label); elsewhere a line every
    :data:`PLAIN_EVERY_S` seconds: ``sweep: 37% (1,135 of 3,072 runs) after 1 min 12 s, about
    2 min 03 s left``. Nothing with ``quiet``."""

    def __init__(self, noun: str, total_items: int | None, total_weight: float,
                 quiet: bool = False, *, what: str | None = None):
        self.noun, self.what = noun, what or noun
        self.total_items, self.total = total_items, max(float(total_weight), 1e-9)
        self.items, self.done, self.note = 0, 0.0, ""
        self._plain = not quiet and not err_console.is_terminal
        self._bar = None
        if not quiet and err_console.is_terminal:
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            count = ("{task.fields[items]}/{task.fields[total_items]} " if total_items is not None
                     else "{task.fields[items]} ") + noun
            self._bar = Progress(
                TextColumn(f"[bold]{self.what}"), BarColumn(), TaskProgressColumn(),
                TextColumn(count), TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(), console=err_console, transient=True)
            self._task = self._bar.add_task(self.what, total=self.total, items=0,
                                            total_items=total_items, note="")
        self._start = self._last = time.monotonic()
        self._done_before = 0.0  # the cost done before this run (a resumed store): not timed

    def advance(self, items: int, weight: float, note: str | None = None) -> None:
        self.update(items=self.items + items, done=self.done + weight, note=note)

    def update(self, *, items: int | None = None, done: float | None = None,
               note: str | None = None) -> None:
        if items is not None:
            self.items = items
        if done is not None:
            self.done = min(float(done), self.total)
        if note is not None:
            self.note = note
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, items=self.items,
                             note=self.note)
        elif self._plain and time.monotonic() - self._last >= PLAIN_EVERY_S:
            self._say()

    def start_at(self, items: int, weight: float) -> None:
        """Work already done before this run (a resumed store): counted, not timed."""
        self.items, self.done = items, min(float(weight), self.total)
        self._done_before = self.done
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, items=self.items)

    def line(self) -> str:
        """The plain progress line as it stands."""
        now = time.monotonic()
        elapsed = now - self._start
        count = (f"{self.items:,} of {self.total_items:,} {self.noun}"
                 if self.total_items is not None else f"{self.items:,} {self.noun}")
        note = f"; {self.note}" if self.note else ""
        text = (f"{self.what}: {100 * self.done / self.total:.0f}% ({count}{note}) after "
                f"{_duration(elapsed)}")
        gained = self.done - self._done_before
        if 0 < gained and self.done < self.total:
            text += f", about {_duration(elapsed * (self.total - self.done) / gained)} left"
        return text

    def _say(self) -> None:
        err_console.print(self.line(), highlight=False, markup=False, soft_wrap=True)
        self._last = time.monotonic()

    def __enter__(self) -> WeightedProgress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


@contextmanager
def drawing(what: str = "drawing tables and plots", quiet: bool = False) -> Iterator[None]:
    """A spinner while views are drawn (nothing with ``quiet``, or outside a terminal)."""
    if quiet or not err_console.is_terminal:
        yield
        return
    with err_console.status(what, spinner="dots"):
        yield

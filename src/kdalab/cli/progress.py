"""Long work on the terminal: a progress bar whose ETA is weighted by each item's estimated cost
(runs differ 100× in cost) and a spinner while views are drawn (both on stderr, so that stdout
holds only results)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kdalab.cli.app import err_console

__all__ = ["WeightedProgress", "drawing"]


class WeightedProgress:
    """A bar over ``total_weight`` cost units that also counts items (``runs`` / ``cells``):
    ``advance(items, weight)`` after each piece of work. The ETA comes from the cost done per
    second, so cheap early runs do not promise an early end."""

    def __init__(self, noun: str, total_items: int, total_weight: float, quiet: bool = False):
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[items]}/{task.fields[total_items]} " + noun),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=err_console, transient=True,
            disable=quiet or not err_console.is_terminal)  # no bar in a log file
        self._task = self._progress.add_task(noun, total=max(total_weight, 1e-9), items=0,
                                             total_items=total_items)
        self.items = 0

    def advance(self, items: int, weight: float) -> None:
        self.items += items
        self._progress.update(self._task, advance=weight, items=self.items)

    def __enter__(self) -> WeightedProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)


@contextmanager
def drawing(what: str = "drawing tables and plots", quiet: bool = False) -> Iterator[None]:
    """A spinner while views are drawn (nothing with ``quiet``)."""
    if quiet or not err_console.is_terminal:
        yield
        return
    with err_console.status(what, spinner="dots"):
        yield

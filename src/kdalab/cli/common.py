"""Shared pieces of the commands: a config object built from options (errors naming the options),
tables on the terminal and JSON-safe values. Running a study into its store lives in
:mod:`kdalab.cli.stored`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kdalab.cli.app import console

__all__ = ["labelled", "print_table", "print_frame", "jsonable", "default_device"]


def labelled(cls, raw: dict, names: dict):
    """``cls(**raw)`` (a config that parses its fields once), its errors naming the options as
    typed (``names``: field -> option)."""
    from kdalab import params
    from kdalab.errors import Unavailable

    try:
        return cls(**raw)
    except (ValueError, Unavailable) as exc:
        raise params.renamed(exc, names) from None


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table on the terminal, its title on a line of its own (a rich title wraps at the
    table's width: "dim ⏎ 128"). No cell is cut or folded: names left, numbers right, each column
    as wide as its widest entry; a table wider than the terminal is printed whole."""
    from rich import box
    from rich.table import Table

    console.print(f"[bold]{title}[/]", highlight=False, soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False)
    for i, col in enumerate(columns):
        cells = [str(row[i]) for row in rows]
        numeric = all(_is_number(c) for c in cells)
        table.add_column(col, justify="right" if numeric else "left", no_wrap=True,
                         min_width=max([len(c) for c in cells] + [len(col)]))
    for row in rows:
        table.add_row(*row)
    width = max(console.width, console.measure(table).maximum)
    console.print(table, width=width, crop=False)
    console.print()


def print_frame(title: str, frame) -> None:
    """A pandas frame as :func:`print_table` prints it: floats in the seed's style (3
    significant digits, ∞), everything else as text."""
    from kdalab.views.tables import fmt_sci

    print_table(title, [str(c) for c in frame.columns],
                [[fmt_sci(v) if isinstance(v, float) else str(v) for v in row]
                 for row in frame.itertuples(index=False)])


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("%").replace("∞", "inf").replace("L^", ""))
        return True
    except ValueError:
        return False


def jsonable(value):
    """JSON-safe: NaN as null, ±inf as strings (as the record store writes them)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def default_device() -> str:
    """``cuda`` where a CUDA device is available, else ``cpu`` (check's and hunt's default)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

"""The inverse experiment's views of a sweep's store: the seed's tables, every aggregate and the
error plot, drawn from the stored records."""

from __future__ import annotations

from pathlib import Path

from kdalab.studies.aggregate import summarize_store
from kdalab.views.plots import plot_error_vs_chunk
from kdalab.views.tables import (
    compare_with_published,
    printed_rows,
    seed_tables,
    write_seed_tables,
)

__all__ = ["draw_sweep_views", "seed_verdict"]


def draw_sweep_views(store) -> tuple[list[Path], list[tuple[str, list[str], list[list[str]]]]]:
    """Draw the views of ``store`` (a :class:`~kdalab.records.RunStore`) into its
    folder, from its records' aggregates (read one group at a time): the seed's tables
    (Markdown and CSV), ``summary.csv`` (every aggregate, one row per configuration) and the
    error plot. Returns the files written and the tables as text, (title, columns, rows), for
    a terminal."""
    summary = summarize_store(store)
    tables = seed_tables(summary)
    paths = write_seed_tables(tables, store.folder)
    summary_csv = store.folder / "summary.csv"
    summary.to_csv(summary_csv, index=False)
    paths.append(summary_csv)
    if not summary.empty:
        paths += plot_error_vs_chunk(summary, store.folder)
    text = [(t.title, list(t.frame.columns), printed_rows(t)) for t in tables]
    return paths, text


def seed_verdict(store) -> tuple[int, int, list[str]]:
    """How many of the seed document's published values the tables of ``store`` (a
    reproduction of its tables) print, of how many, and which differ
    (:func:`~kdalab.views.tables.compare_with_published`)."""
    same, differ = compare_with_published(seed_tables(summarize_store(store)))
    return same, same + len(differ), differ

"""Aggregation of inverse-experiment records as the seed document describes: errors are medians
over seeds, counts of non-finite scales the worst observed value, "finite" the fraction of runs
whose inverse is finite, and the "max power magnitude" the largest power entry over seeds.

The seed's printed tables draw "INV power" from ``inv_stable_l_rel_rmse`` and "Highest power" /
"Max power magnitude" from the Neumann inverse of the *stable* L (``stable_l_highest_power``, max of
``stable_l_power_max``): checked against the golden H200 runs, the max over seeds of
``stable_l_power_max`` reproduces every printed value (e.g. weak_decay_correlated, C = 24: 532 →
5.32×10²), while ``kernel_power_max`` does not (530).
"""

from __future__ import annotations

import pandas as pd

__all__ = ["GROUP_KEYS", "SUMMARY_COLUMNS", "summarize", "summarize_store"]

GROUP_KEYS = ["family", "lower_bound", "chunk", "dim", "accumulation"]
_MEDIANS = ["l_rel_rmse", "inv_total_rel_rmse", "inv_neumann_only_rel_rmse",
            "inv_stable_l_rel_rmse", "inverse_residual", "kernel_power_max",
            "stable_l_power_max"]


def summarize(records: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """One row per (family, lower_bound, chunk, dim, accumulation): the run count, fractions of
    finite results, the worst counts and powers, medians over seeds and the largest power
    entries. A median or maximum over values of which one is NaN is NaN (as ``np.median`` and
    ``np.max`` give it; pandas' own skip NaN). One groupby per statistic, not a loop over the
    configurations (a loop was the views' largest cost on a large sweep)."""
    df = records if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=GROUP_KEYS)
    # None → NaN, kept by groupby; statistics in float64, as before (pandas' median of a
    # float32 column is rounded to float32)
    df = df.assign(lower_bound=df["lower_bound"].astype(float),
                   **{m: df[m].astype("float64") for m in _MEDIANS})
    groups = df.groupby(GROUP_KEYS, dropna=False, sort=True)
    has_nan = df[_MEDIANS].isna().groupby([df[k] for k in GROUP_KEYS], dropna=False,
                                          sort=True).any()

    def nan_propagating(stat: pd.DataFrame) -> pd.DataFrame:
        return stat.mask(has_nan[stat.columns])

    out = pd.DataFrame({"runs": groups.size().astype("int64")})
    for flag in ("inv_finite", "l_finite"):
        out[f"{flag}_fraction"] = groups[flag].mean().astype(float)  # 0/1 sums: exact
    out["decay_zeros_max"] = groups["decay_zeros"].max().astype("int64")
    out["inv_decay_nonfinite_max"] = groups["inv_decay_nonfinite"].max().astype("int64")
    out["highest_power"] = groups["highest_power"].max().astype("int64")
    out["stable_l_highest_power"] = groups["stable_l_highest_power"].max().astype("int64")
    medians = nan_propagating(groups[_MEDIANS].median())
    for m in _MEDIANS:
        out[f"{m}_median"] = medians[m]
    powers = ["kernel_power_max", "stable_l_power_max"]
    maxima = nan_propagating(groups[powers].max())
    for m in powers:
        out[f"{m}_max"] = maxima[m]
    return out.reset_index()


#: the record columns :func:`summarize` reads
SUMMARY_COLUMNS = GROUP_KEYS + ["inv_finite", "l_finite", "decay_zeros", "inv_decay_nonfinite",
                                "highest_power", "stable_l_highest_power"] + _MEDIANS


#: Records summarized at once: a store's groups are read one at a time and summarized in
#: runs of up to this many records (memory stays bounded; one groupby for a whole run).
SUMMARY_ROWS = 1 << 20


def summarize_store(store) -> pd.DataFrame:
    """:func:`summarize` of a :class:`~kdalab.records.RunStore`'s records, read
    one group at a time and only the columns it needs (memory: about :data:`SUMMARY_ROWS`
    records, whatever the sweep's size). Groups hold whole (chunk, dim) cells, so the rows are
    those of ``summarize(all records)``."""
    import pyarrow as pa

    parts, tables, rows = [], [], 0
    for _, table in store.iter_groups(SUMMARY_COLUMNS):
        tables.append(table)
        rows += table.num_rows
        if rows >= SUMMARY_ROWS:
            parts.append(summarize(pa.concat_tables(tables).to_pandas()))
            tables, rows = [], 0
    if tables:
        parts.append(summarize(pa.concat_tables(tables).to_pandas()))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=GROUP_KEYS)
    return pd.concat(parts, ignore_index=True).sort_values(GROUP_KEYS, ignore_index=True)

"""The one record store: Parquet parts keyed by run, with a manifest (identity, writer, reader)."""

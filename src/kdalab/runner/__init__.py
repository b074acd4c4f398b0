"""Where a study's batches run: in this process, or on Ray."""

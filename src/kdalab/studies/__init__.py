"""The studies: each is config -> plan -> batches -> records, with its aggregates beside it."""

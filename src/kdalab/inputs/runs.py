"""A run of the inverse experiment: one draw of one family's inputs, identified by its key.

A :class:`Run` is a plain tuple (cheap to build for millions of runs, hashable, a record's key):
it is checked where it is made from what a user gave (:meth:`Run.checked`,
:func:`kdalab.studies.sweep.plan_runs`), and nothing below checks it again.
"""

from __future__ import annotations

from typing import NamedTuple

from kdalab import params
from kdalab.inputs.families import get_family

__all__ = ["Run"]


class Run(NamedTuple):
    family: str
    lower_bound: float | None  # None for families that ignore it
    chunk: int
    seed: int
    dim: int

    @classmethod
    def checked(cls, family, chunk, seed, dim, lower_bound=-5.0) -> Run:
        """A run from raw values, each checked (ValueError naming it); the lower bound is dropped
        for families that ignore it, so equal runs have equal keys."""
        fam = get_family(family)
        return cls(fam.name,
                   params.lower_bound(lower_bound) if fam.uses_lower_bound else None,
                   params.integer(chunk, "chunk", 1), params.integer(seed, "seed", 0),
                   params.integer(dim, "dim", 1))

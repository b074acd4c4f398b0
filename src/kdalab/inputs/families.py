"""Input families of the seed document's inverse experiment, as data.

A :class:`Family` says what a run draws and what it fixes; the draw engine
(:mod:`kdalab.inputs.draw`) reads these fields and draws, for a given seed, from
``torch.Generator(device="cpu").manual_seed(seed)`` in the seed's order, so kdalab's inputs are
bit-identical to the seed code's:

``floor``                  every step at the lower bound (the seed's ``floor_e-5`` for −5);
                           keys ~ N(0, I) normalized, β = sigmoid(N(0, 1)).
``weak_decay_correlated``  one normalized random key repeated, g = −0.01, β = 0.5 (stresses the
                           high powers of L without touching the exponent range).
``model_like``             keys as ``floor``, g = lower_bound · sigmoid(N(0, 1)), then β as
                           ``floor``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdalab import params

__all__ = ["Family", "FAMILIES", "FLOOR", "WEAK_DECAY_CORRELATED", "MODEL_LIKE", "get_family"]


@dataclass(frozen=True)
class Family:
    """What one run of the family draws (in this order: keys, gate, β) and what it fixes.

    ``shared_key``: one normalized key, repeated at every step (else one per step).
    ``random_gate``: g = lower_bound · sigmoid(N(0, 1)) per step; else g is ``log_decay`` if set,
    the lower bound itself otherwise. ``random_beta``: β = sigmoid(N(0, 1)) per step; else
    ``beta``. ``uses_lower_bound``: runs differ by lower bound (else one run serves them all).
    ``seed_name``: the seed document's name of the case (at lower bound −5).
    """

    name: str
    seed_name: str
    uses_lower_bound: bool
    shared_key: bool = False
    random_gate: bool = False
    random_beta: bool = True
    log_decay: float | None = None
    beta: float | None = None


FLOOR = Family("floor", "floor_e-5", uses_lower_bound=True)
WEAK_DECAY_CORRELATED = Family("weak_decay_correlated", "weak_decay_correlated",
                               uses_lower_bound=False, shared_key=True, random_beta=False,
                               log_decay=-0.01, beta=0.5)
MODEL_LIKE = Family("model_like", "model_like", uses_lower_bound=True, random_gate=True)

FAMILIES: dict[str, Family] = {f.name: f for f in (FLOOR, WEAK_DECAY_CORRELATED, MODEL_LIKE)}
_SEED_NAMES = {f.seed_name: f for f in FAMILIES.values()}


def get_family(value: str | Family, name: str = "family") -> Family:
    """A family by name (or the seed's case name, e.g. ``floor_e-5``)."""
    if isinstance(value, Family):
        return value
    found = FAMILIES.get(value) or _SEED_NAMES.get(value)
    if found is None:
        params.choice(value, name, FAMILIES)  # raises, naming the accepted families
    return found

"""The seed document's experiment on (I + L)⁻¹, batched: whole groups of runs per tensor op.

One *run* is (family, lower bound, chunk C, seed, dim); runs of equal (C, dim) are stacked and go
through every stage together. Each run yields one record per accumulation model, with the seed's
metric keys and definitions:

=============================  ===============================================================
decay_zeros                    scale factors exp(G_i) that flushed to 0 (count)
inv_decay_nonfinite            reciprocal scales exp(−G_j) that overflowed (count)
l_finite, inv_finite           1 if the kernel's L / Neumann inverse is all finite
l_rel_rmse                     kernel L vs stable fp64 L
inv_total_rel_rmse             Neumann inverse of the kernel L vs exact inverse of the stable L
inv_neumann_only_rel_rmse      Neumann inverse of the kernel L vs exact inverse of the kernel L
inv_stable_l_rel_rmse          Neumann inverse of fp16(stable L) vs exact inverse of stable L
                               (the seed's printed "INV power" column)
inverse_residual               ‖(I + L_stable)·INV_kernel − I‖ relative
highest_power, kernel_power_max, stable_l_highest_power, stable_l_power_max
=============================  ===============================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdalab.arith import (
    FP16,
    AccumulationModel,
    fp32_companion,
    get_accumulation,
    on_device,
    rel_rmse,
    torch_cast,
)
from kdalab.arith.linalg import inv64, matmul64
from kdalab.inputs.draw import ChunkInputs, make_inputs_batch
from kdalab.inputs.runs import Run
from kdalab.kda.intra import kernel_l, stable_l
from kdalab.kda.inverse import neumann_inverse
from kdalab.kda.recipe import Recipe, get_recipe

__all__ = ["METRIC_KEYS", "KEY_FIELDS", "run_group", "launch_group", "PendingGroup",
           "record_schema"]

KEY_FIELDS = ("family", "lower_bound", "chunk", "seed", "dim", "accumulation", "l_accumulation")
METRIC_KEYS = (
    "decay_zeros", "inv_decay_nonfinite", "l_finite", "inv_finite", "l_rel_rmse",
    "inv_total_rel_rmse", "inv_neumann_only_rel_rmse", "inv_stable_l_rel_rmse",
    "inverse_residual", "highest_power", "kernel_power_max", "stable_l_highest_power",
    "stable_l_power_max",
)


#: Metrics that are counts or flags (ints in the records; carried as float64 until then).
INT_METRICS = frozenset({"decay_zeros", "inv_decay_nonfinite", "l_finite", "inv_finite"})
_TENSOR_METRICS = tuple(k for k in METRIC_KEYS
                        if k not in ("highest_power", "stable_l_highest_power"))


def run_group(
    specs: Sequence[Run],
    accumulations: Sequence[str | AccumulationModel],
    *,
    recipe: Recipe | str = "seed",
    device: str | torch.device = "cpu",
) -> list[dict]:
    """Run runs that share (chunk, dim) as one batch; one record per run and accumulation model."""
    if not specs:
        return []
    return launch_group(specs, accumulations, recipe=recipe, device=device).collect()


@dataclass
class PendingGroup:
    """A group whose device work is queued: :meth:`collect` waits for it and builds the records.

    ``metrics`` is [models, metrics, runs] float64 on the device (``_TENSOR_METRICS`` order), so
    collecting is one device→host copy.
    """

    specs: Sequence[Run]
    plans: list[tuple[str, str, int, int]]  # name, L model, highest_power, stable highest_power
    metrics: torch.Tensor

    def table(self, runs: Sequence[int] | None = None):
        """The group's records as an Arrow table of :func:`record_schema` (``run``: each run's
        index in its sweep, ``runs``; default 0…): one per run and accumulation model, the
        models in order, each over the runs in order. One device→host copy."""
        import numpy as np
        import pyarrow as pa

        values = self.metrics.cpu().numpy()  # [models, metrics, runs]
        n, m = len(self.specs), len(self.plans)
        index = np.arange(n) if runs is None else np.asarray(runs, dtype=np.int64)
        family, lower_bound, chunk, seed, dim = (list(col) for col in zip(*self.specs))
        bounds = np.array([np.nan if b is None else b for b in lower_bound], dtype=np.float64)
        models = np.repeat(np.arange(m), n)
        columns: dict = {
            "run": np.tile(index, m),
            "family": family * m,
            "lower_bound": pa.array(np.tile(bounds, m), pa.float64(),
                                    mask=np.tile([b is None for b in lower_bound], m)),
            "chunk": np.tile(np.asarray(chunk, dtype=np.int64), m),
            "seed": np.tile(np.asarray(seed, dtype=np.int64), m),
            "dim": np.tile(np.asarray(dim, dtype=np.int64), m),
            "accumulation": [self.plans[i][0] for i in models.tolist()],
            "l_accumulation": [self.plans[i][1] for i in models.tolist()],
        }
        tensor = {key: values[:, i].reshape(-1) for i, key in enumerate(_TENSOR_METRICS)}
        for key in METRIC_KEYS:
            if key == "highest_power":
                columns[key] = np.repeat([p for _, _, p, _ in self.plans], n)
            elif key == "stable_l_highest_power":
                columns[key] = np.repeat([p for _, _, _, p in self.plans], n)
            else:
                columns[key] = tensor[key]
        schema = record_schema()
        return pa.Table.from_arrays([_column(columns[f.name], f.type) for f in schema],
                                    schema=schema)

    def collect(self) -> list[dict]:
        """The records as dicts (:meth:`table`'s rows without ``run``)."""
        return self.table().drop_columns(["run"]).to_pylist()


def _column(values, type_):
    """An Arrow column of ``type_``: numbers cast as NumPy casts them (the counts, carried as
    float64, are exact integers)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, pa.Array) or pa.types.is_string(type_):
        return pa.array(values, type_)
    return pa.array(np.asarray(values, dtype=type_.to_pandas_dtype()), type_)


def record_schema():
    """The Arrow schema of the inverse experiment's records: ``run`` (the run's index in its
    sweep), the key fields, then the metrics (counts, flags and powers as int64)."""
    import pyarrow as pa

    ints = INT_METRICS | {"highest_power", "stable_l_highest_power"}
    return pa.schema(
        [("run", pa.int64()), ("family", pa.string()), ("lower_bound", pa.float64()),
         ("chunk", pa.int64()), ("seed", pa.int64()), ("dim", pa.int64()),
         ("accumulation", pa.string()), ("l_accumulation", pa.string())]
        + [(key, pa.int64() if key in ints else pa.float64()) for key in METRIC_KEYS])


def launch_group(
    specs: Sequence[Run],
    accumulations: Sequence[str | AccumulationModel],
    *,
    recipe: Recipe | str = "seed",
    device: str | torch.device = "cpu",
    inputs: ChunkInputs | None = None,
) -> PendingGroup:
    """Queue a group's work on ``device`` and return without waiting for it (on CUDA no step
    here waits for the GPU). ``inputs``: the group's inputs if already drawn
    (:func:`~kdalab.inputs.draw.make_inputs_batch`), else drawn here."""
    if not specs:
        raise ValueError("launch_group needs at least one run")
    chunk, dim = specs[0].chunk, specs[0].dim
    if any(s.chunk != chunk or s.dim != dim for s in specs):
        raise ValueError("run_group needs runs of one chunk size and one dim")
    recipe = get_recipe(recipe)
    device = torch.device(device)
    # Each accumulation model runs on its own hardware's L: an H200 model builds L with the
    # H200's fp32 GEMM (as the seed's GPU run did), the others with the recipe's. On CUDA, CPU
    # emulations of the H200 become the GPU's own arithmetic.
    plans = []  # (name, model on this device, L's model on this device): models, not names
    for model in map(get_accumulation, accumulations):  # names (the Python API) become models
        l_model = on_device(fp32_companion(model, recipe.l_accumulation), device.type)
        plans.append((model.name, on_device(model, device.type), l_model))

    if inputs is None:
        inputs = make_inputs_batch(specs, device)
    keys, log_decay, beta = inputs.keys, inputs.log_decay, inputs.beta

    eye = torch.eye(chunk, dtype=torch.float64, device=device)
    l_ref = stable_l(keys, log_decay, beta)
    # inv_ex: no error check, so no wait for the GPU (I + L is unit lower triangular: invertible)
    inv_ref = inv64(eye + l_ref)
    l_stable_stored = torch_cast(l_ref, FP16).half()  # the seed's l_ref.half()

    kernel_ls: dict[str, dict] = {}  # per L accumulation model, by name
    for _, _, l_model in plans:
        if l_model.name in kernel_ls:
            continue
        kl = kernel_l(keys, log_decay, beta, recipe.with_(l_accumulation=l_model))
        l_finite = torch.isfinite(kl.l).flatten(-2).all(-1)
        # exact inverse of the kernel's own L, where it is finite
        safe_l = torch.where(l_finite[:, None, None], kl.l.double(), torch.zeros_like(l_ref))
        kernel_ls[l_model.name] = {
            "l": kl.l,
            "inv_of_kernel_l": inv64(eye + safe_l),
            "decay_zeros": (kl.decay == 0).flatten(-2).sum(-1),
            "inv_decay_nonfinite": (~torch.isfinite(kl.inv_decay)).flatten(-2).sum(-1),
            "l_finite": l_finite,
            "l_rel_rmse": rel_rmse(kl.l, l_ref),
        }

    stacked, plan_info = [], []
    for name, model, l_model in plans:
        k = kernel_ls[l_model.name]
        l_kernel, l_finite = k["l"], k["l_finite"]
        kn = neumann_inverse(l_kernel, model, recipe.inverse_format)
        sn = neumann_inverse(l_stable_stored, model, recipe.inverse_format)
        kernel_inv = kn.inverse
        neumann_only = rel_rmse(kernel_inv, k["inv_of_kernel_l"])
        metrics = {
            "decay_zeros": k["decay_zeros"],
            "inv_decay_nonfinite": k["inv_decay_nonfinite"],
            "l_finite": l_finite,
            "inv_finite": torch.isfinite(kernel_inv).flatten(-2).all(-1),
            "l_rel_rmse": k["l_rel_rmse"],
            "inv_total_rel_rmse": rel_rmse(kernel_inv, inv_ref),
            "inv_neumann_only_rel_rmse": torch.where(
                l_finite, neumann_only, torch.full_like(neumann_only, math.inf)),
            "inv_stable_l_rel_rmse": rel_rmse(sn.inverse, inv_ref),
            "inverse_residual": rel_rmse(matmul64(eye + l_ref, kernel_inv),
                                         eye.expand_as(l_ref)),
            "kernel_power_max": kn.power_max,
            "stable_l_power_max": sn.power_max,
        }
        # counts and flags are exact in float64: one tensor, one copy back
        stacked.append(torch.stack([metrics[key].to(torch.float64) for key in _TENSOR_METRICS]))
        plan_info.append((name, l_model.name, kn.highest_power, sn.highest_power))
    return PendingGroup(specs, plan_info, torch.stack(stacked))

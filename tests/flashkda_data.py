"""Reading the FlashKDA golden data (``scripts/device/flashkda_golden.py`` writes it on the H200).

The file holds, per case, the inputs in FlashKDA's layout and dtypes and the outputs of its CUDA
kernel (``out_kernel``, ``final_kernel``) and of its torch reference (``out_ref``, ``final_ref``);
bf16 tensors are stored as their uint16 bit patterns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GOLDEN_DIR = Path(__file__).parent / "data" / "flashkda"
GOLDEN_FILE = GOLDEN_DIR / "flashkda_golden.npz"


@dataclass(frozen=True)
class GoldenCase:
    name: str
    meta: dict
    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def get(self, key: str):
        return self.tensors.get(key)


def _tensor(a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def load_golden(path: str | Path = GOLDEN_FILE) -> tuple[dict, list[GoldenCase]]:
    """The run's facts (device, versions, …) and its cases, in file order."""
    with np.load(path) as z:
        facts = json.loads(bytes(z["meta_json"]).decode())
        arrays = {k: z[k] for k in z.files if k != "meta_json"}
    cases = []
    for meta in facts["cases"]:
        prefix = meta["key"] + "__"
        tensors = {k[len(prefix):]: _tensor(v) for k, v in arrays.items() if k.startswith(prefix)}
        cases.append(GoldenCase(meta["name"], meta, tensors))
    return facts, cases

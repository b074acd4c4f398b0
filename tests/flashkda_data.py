"""Reading the FlashKDA golden data (``scripts/device/flashkda_golden.py`` writes it on the H200).

The file holds, per case, the inputs in FlashKDA's layout and dtypes and the outputs of its CUDA
kernel (``out_kernel``, ``final_kernel``) and of its torch reference (``out_ref``, ``final_ref``);
bf16 tensors are stored as their uint16 bit patterns.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GOLDEN_DIR = Path(__file__).parent / "data" / "flashkda"
GOLDEN_FILE = GOLDEN_DIR / "flashkda_golden.npz"
#: sha256 of ``torch.randn(4096)`` then ``torch.rand(4096)`` (float32) from a CPU generator
#: seeded 2026, as torch draws them under ATen's vectorized CPU kernels (AVX2 and AVX512 give
#: the same bits, and the golden inputs are such draws): under the generic kernels
#: (``ATEN_CPU_CAPABILITY=default``) float32 randn rounds otherwise.
REFERENCE_DRAW = "08f8cbb27c2a8bb00c326154f3527b02276a8eed977b1fd1be54928ee83e57c2"


@dataclass(frozen=True)
class GoldenCase:
    name: str
    meta: dict
    tensors: dict[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def get(self, key: str):
        return self.tensors.get(key)


def unreproducible_draw() -> str | None:
    """None where torch's seeded CPU draws give the bits the golden inputs were drawn with (a
    reference draw's digest matches :data:`REFERENCE_DRAW`); else the reason, for a skip: the
    stored inputs stay the golden data, only their re-draw cannot be compared here."""
    gen = torch.Generator().manual_seed(2026)
    a, b = torch.randn(4096, generator=gen), torch.rand(4096, generator=gen)
    if hashlib.sha256(a.numpy().tobytes() + b.numpy().tobytes()).hexdigest() == REFERENCE_DRAW:
        return None
    return (f"torch's seeded float32 CPU draws round otherwise here (ATen CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}; the golden inputs are AVX2/AVX512 "
            f"draws): the script's inputs cannot be re-drawn bit for bit on this machine")


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

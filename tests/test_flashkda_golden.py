"""kdalab's FlashKDA recipes against FlashKDA itself, run on the H200.

The golden data (``tests/data/flashkda/flashkda_golden.npz``) is FlashKDA's own output — its CUDA
kernel and its torch reference (``tests/torch_ref.py``) — on the cases that
``scripts/device/flashkda_golden.py`` draws: partial chunks (T = 1, 15, 16, 17, 100, 257, 300),
varlen with 1- and 2-token sequences, bf16 and fp32 initial states, B = 1 and 2, H = 1..4, lower
bounds −5, −2, −0.5, model-like, wide, saturated and weak-decay correlated inputs.
``flashkda-h200`` models the CUDA kernel cast for cast (docs/flashkda.md), ``flashkda`` the torch
reference.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kdalab.kda import forward
from tests.flashkda_data import GOLDEN_FILE, load_golden

_SCRIPT = Path(__file__).parents[1] / "scripts" / "device" / "flashkda_golden.py"


def _script():
    spec = importlib.util.spec_from_file_location("flashkda_golden_cases", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


SCRIPT = _script()
CASE_NAMES = [c.name for c in SCRIPT.CASES]

#: Issue 12's fidelity target: at least 99.9 % of the output bits (and of the final state's)
#: equal to FlashKDA's CUDA kernel on every case. A one-ulp difference in a bf16 value costs one
#: to a few of its 16 bits, so this admits about 1 % of values off by an ulp and no more.
KERNEL_BITS = 0.999
#: The torch reference: the same target.
REF_BITS = 0.999


@pytest.fixture(scope="module")
def golden():
    if not GOLDEN_FILE.exists():
        pytest.fail(f"{GOLDEN_FILE} is missing. It is FlashKDA's output on the H200: run "
                    "scripts/device/flashkda_golden.py on the device (docs/flashkda.md) and "
                    "commit its flashkda_golden.npz there.")
    facts, cases = load_golden(GOLDEN_FILE)
    return facts, {c.name: c for c in cases}


def run(case, recipe: str):
    """The recipe on the case's inputs, FlashKDA's call (layouts, state dtype)."""
    init = case.get("initial_state")
    o, s = forward(case["q"], case["k"], case["v"], case["g"], case["beta"],
                   scale=case.meta["scale"], A_log=case["A_log"], dt_bias=case["dt_bias"],
                   lower_bound=case.meta["lower_bound"], initial_state=init,
                   output_final_state=True, cu_seqlens=case.get("cu_seqlens"),
                   state_layout="VK", chunk_size=16, tiles="chunk_start", inverse="neumann",
                   recipe=recipe)
    return o, s


def equal_bits(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of equal bits of two tensors of one dtype (bf16 or fp32)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    itype = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    x = (a.contiguous().view(itype) ^ b.contiguous().view(itype)).to(torch.int64)
    width = 16 if itype == torch.int16 else 32
    x = x & ((1 << width) - 1)
    differing = sum(int(((x >> i) & 1).sum()) for i in range(width))
    return 1.0 - differing / (x.numel() * width)


def test_the_golden_data_comes_from_flashkda_on_the_h200(golden):
    facts, cases = golden
    assert "H200" in facts["device"], facts["device"]
    assert sorted(cases) == sorted(CASE_NAMES)
    for case in cases.values():
        assert case.meta["kernel_deterministic"] and case.meta["raw_entry_same"], case.name
    # the inputs are the device script's seeded draws, bit for bit
    for spec in SCRIPT.CASES:
        drawn, case = SCRIPT.draw(spec), cases[spec.name]
        for key, t in drawn.items():
            assert torch.equal(t.view(torch.int16) if t.dtype == torch.bfloat16 else t,
                               case[key].view(torch.int16) if t.dtype == torch.bfloat16
                               else case[key]), (spec.name, key)
    # the kernel and its reference differ somewhere (else a test of both would be one test)
    assert any(not torch.equal(c["out_kernel"], c["out_ref"]) for c in cases.values())


@pytest.mark.parametrize("name", CASE_NAMES)
def test_flashkda_h200_matches_the_cuda_kernel(golden, name):
    case = golden[1][name]
    o, s = run(case, "flashkda-h200")
    want_s = case["final_kernel"]
    assert equal_bits(o, case["out_kernel"]) >= KERNEL_BITS
    assert equal_bits(s.to(want_s.dtype), want_s) >= KERNEL_BITS


@pytest.mark.parametrize("name", CASE_NAMES)
def test_flashkda_matches_the_torch_reference(golden, name):
    case = golden[1][name]
    o, s = run(case, "flashkda")
    want_s = case["final_ref"]
    assert equal_bits(o, case["out_ref"]) >= REF_BITS
    assert equal_bits(s.to(want_s.dtype), want_s) >= REF_BITS


def test_equal_bits_counts_bits():
    a = torch.tensor([1.0, -2.0]).bfloat16()
    b = a.clone()
    b.view(torch.int16)[1] ^= 0x4001  # two bits of 32
    assert equal_bits(a, b) == 1 - 2 / 32 and equal_bits(a, a) == 1.0
    f = torch.tensor([1.5], dtype=torch.float32)
    assert equal_bits(f, -f) == 1 - 1 / 32

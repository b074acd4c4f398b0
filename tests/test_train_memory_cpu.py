"""benchmarks/train_memory_cpu.py: its allocation count, on known allocations and on a tiny
training step (a child process: the script stubs every Triton launch in its process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_memory_cpu.py"
sys.path.insert(0, str(SCRIPT.parent))

import train_memory_cpu  # noqa: E402


def test_peak_of_counts_live_bytes_not_the_sum():
    # two 4-MiB tensors live at once, then one freed and a 2-MiB one made: the peak is 8 MiB
    # (the sum of the three, 10, or the end state, 6, would be the wrong figures)
    def fn():
        a = torch.empty(1 << 20, dtype=torch.float32)
        b = torch.empty(1 << 20, dtype=torch.float32)
        del a
        c = torch.empty(1 << 19, dtype=torch.float32)
        return b, c

    assert train_memory_cpu.peak_of(fn) == pytest.approx(8.0, abs=0.01)


def _run(tmp_path, *extra):
    out = tmp_path / "mem.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "1,64,1;1,128,1", "--json",
                          str(out), *extra], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(out.read_text())["rows"]


def test_the_script_counts_a_tiny_step(tmp_path):
    rows = _run(tmp_path, "--no-fla")
    assert [r["unit"] for r in rows] == ["MiB", "MiB"] and "note" not in rows[0]
    small, big = (r["value"] for r in rows)
    assert 0 < small < big  # more for twice the tokens


def test_the_script_counts_fla_beside_kdalab(tmp_path):
    pytest.importorskip("fla")
    rows = _run(tmp_path)
    theirs = [float(r["note"].split()[1]) for r in rows]  # "fla X MiB (...)"
    assert 0 < theirs[0] < theirs[1]


def test_a_bench_train_shape_counts_as_its_triple(tmp_path):
    # bench_train.py's T1024_H16 (its inputs, calls and upstream gradients) is B 1, T 1024,
    # H 16 without an initial state: the same buffers, so the same count
    out = tmp_path / "mem.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--shapes", "T1024_H16;1,1024,16",
                          "--no-fla", "--json", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    named, triple = (r["value"] for r in json.loads(out.read_text())["rows"])
    assert named == triple > 0

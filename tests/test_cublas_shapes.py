"""The summation orders that benchmarks/cublas_shapes.py compares cuBLAS against
(kdalab.arith.orders), the H200's cublasGemmEx outputs against the h200 model (golden data), and
the script itself, run as a subprocess with cuBLAS replaced by one candidate on the CPU
(``--stand-in``): the measurement must name that candidate and no other. The tests import nothing
from benchmarks/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kdalab.arith import FP16, get_accumulation
from kdalab.arith.orders import ORDERS, ordered_gemm
from kdalab.arith.tensorcore import gemmex_16f, tc_chain

pytestmark = pytest.mark.exact  # summation orders and cuBLAS's outputs, bit for bit

ORDER = {o.name: o for o in ORDERS}
ROOT = Path(__file__).parents[1]


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same fp16/fp32 bits (any NaN equals any NaN)."""
    x, y = x.cpu(), y.cpu()
    iview = torch.int16 if x.dtype == torch.float16 else torch.int32
    return (torch.isnan(x) & torch.isnan(y)) | (x.view(iview) == y.contiguous().view(iview))


def _measure(tmp_path, *args) -> dict[str, dict]:
    """cublas_shapes.py's rows (--json), keyed by target, with each row's 100 % candidates."""
    out = tmp_path / "cublas_shapes.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cublas_shapes.py"),
                          "--json", str(out), *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # the file is one docs/BENCHMARKS.md takes
    page = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--results",
                           str(tmp_path), "--page", str(tmp_path / "page.md")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert page.returncode == 0, page.stderr
    rows = json.loads(out.read_text())["rows"]
    return {r["target"]: dict(r, exact=r.get("note", "").partition("100 %: ")[2].split(", "))
            for r in rows}


def test_orders_cut_k_as_named():
    assert ORDER["slices8-seq"].groups(24) == [[(0, 8), (8, 16), (16, 24)]]
    assert ORDER["slices8-tree"].groups(24) == [[(0, 8)], [(8, 16)], [(16, 24)]]
    assert ORDER["splitk2-k16"].groups(64) == [[(0, 16), (16, 32)], [(32, 48), (48, 64)]]
    assert ORDER["interleave2-k16"].groups(64) == [[(0, 16), (32, 48)], [(16, 32), (48, 64)]]
    assert ORDER["parts32-k8"].groups(40) == [[(0, 8), (8, 16), (16, 24), (24, 32)], [(32, 40)]]
    # equal orders at a k share one key: at k ≤ 16 every k16 order is one block
    key = {name: o.key(16) for name, o in ORDER.items()}
    assert key["mma-k16-chain"] == key["splitk4-k16-tree"] == key["slices16-seq"]
    assert key["slices8-seq"] == key["slices8-tree"]  # two slices: one add either way
    assert ORDER["slices8-seq"].key(64) != ORDER["slices8-tree"].key(64)
    assert ORDER["slices8-seq"].key(64) != ORDER["mma-k16-chain"].key(64)


def test_orders_equal_the_library_models():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(6, 24, 48, generator=g) * 4).half().double()
    b = (torch.randn(6, 48, 24, generator=g) * 4).half().double()
    assert torch.equal(ordered_gemm(a, b, ORDER["slices8-seq"]), gemmex_16f(a, b))
    assert torch.equal(ordered_gemm(a, b, ORDER["mma-k16-chain"]),
                       tc_chain(a, b, FP16, FP16))


def test_measurement_names_the_stand_ins_order(tmp_path):
    rows = _measure(tmp_path, "--stand-in", "slices8-tree", "--square", "32", "--matrices", "4",
                    "--runs", "2", "--fwdsub-k", "24", "--raw", tmp_path / "raw.npz")
    assert set(rows) == {f"cublasGemmEx {s}: h200 model" for s in (
        "32x32x32 (neumann)", "32x32x32 (dense)", "1x24x64 (fwdsub)")}
    assert all("slices8-tree" in r["exact"] for r in rows.values())
    # dense operands tell a tree of four slices from the h200 model's left-to-right sum
    dense = rows["cublasGemmEx 32x32x32 (dense): h200 model"]
    assert "h200" not in dense["exact"] and dense["value"] < 0.9
    # the failing shape's operands and outputs go to --raw, and replay
    assert 0 < (tmp_path / "raw.npz").stat().st_size < 5_000_000
    with np.load(tmp_path / "raw.npz") as z:
        a, b, out = (torch.from_numpy(z[f"dense_32x32x32_{x}"]) for x in ("a", "b", "out"))
        assert "32x32x32" in str(z["table_json"])
    assert torch.equal(ordered_gemm(a, b, ORDER["slices8-tree"]), out)
    assert not torch.equal(gemmex_16f(a.double(), b.double()), out)


def test_the_chain_at_64_agrees_when_the_stand_in_is_the_model(tmp_path):
    rows = _measure(tmp_path, "--stand-in", "h200", "--square", "64", "--matrices", "2",
                    "--runs", "2", "--fwdsub-k", "")
    chain = rows["Neumann chain C = 64 (model_like): runs differing from h200"]
    assert (chain["value"], chain["unit"], chain["note"]) == (
        0, "of 2 runs", "max |Δ inv_stable_l_rel_rmse| 0")
    neumann = rows["cublasGemmEx 64x64x64 (neumann): h200 model"]
    assert neumann["note"].startswith(f"{2 * 2 * 5}/{2 * 2 * 5} matrices equal")
    assert "h200" in neumann["exact"]


def test_a_spent_budget_skips_the_remaining_shapes(tmp_path):
    rows = _measure(tmp_path, "--stand-in", "h200", "--square", "16,64", "--matrices", "1",
                    "--runs", "1", "--fwdsub-k", "", "--budget-s", "0")
    assert list(rows) == ["neumann 64", "dense 64", "neumann 16", "dense 16"]
    assert all(r["unit"] == "error" and r["note"] == "skipped: time budget"
               for r in rows.values())


def test_a_dense_sweep_over_chosen_shapes_and_candidates(tmp_path):
    rows = _measure(tmp_path, "--stand-in", "mma-k16-chain", "--dense-only", "--square", "20",
                    "--matrices", "3", "--shapes", "1x40x32,24x24x64",
                    "--candidates", "mma-k16-chain,slices8-seq")
    exact = {t.split()[1]: r["exact"] for t, r in rows.items()}
    assert set(exact) == {"20x20x20", "1x40x32", "24x24x64"}
    assert all("mma-k16-chain" in e and set(e) <= {"h200", "mma-k16-chain", "slices8-seq"}
               for e in exact.values())
    # the model chains at n = 64 (a multiple of 32 from 64 on) and slices below
    assert "h200" in exact["24x24x64"] and "h200" not in exact["20x20x20"]


@pytest.mark.parametrize("name", sorted(ORDER))
def test_every_order_runs_on_a_ragged_k(name):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 41, generator=g).half()
    b = torch.randn(2, 41, 5, generator=g).half()
    out = ordered_gemm(a, b, ORDER[name])
    assert out.dtype == torch.float16 and out.shape == (2, 3, 5)
    assert torch.allclose(out.float(), (a.float() @ b.float()), atol=0.05)  # fp16 sums of 41


def test_a_launch_gets_flat_operands_and_zeros_where_k_is_zero():
    from kdalab.arith.gpu import product

    a, b = torch.ones(3, 1, 4, 0, dtype=torch.float16), torch.ones(2, 0, 5, dtype=torch.float16)
    p = product(a, b, torch.float32, "x", torch.float16)
    assert p.a.shape == (6, 4, 0) and p.b.shape == (6, 0, 5) and p.lead == (3, 2)
    assert p.result().shape == (3, 2, 4, 5) and bool((p.result() == 0).all())
    with pytest.raises(ValueError, match="x: operands must be torch.bfloat16"):
        product(a, b, torch.float32, "x", torch.bfloat16)


def test_h200_equals_cublas_gemmex_where_cublas_chains():
    """The H200's cublasGemmEx outputs at the shapes where it runs a k16 chain, not slices of 8
    (benchmarks/cublas_shapes.py on the H200, a subset of its --raw npz, the matrices where
    slices of 8 differ first): the model equals every bit, and slices of 8 would not."""
    path = Path(__file__).parent / "data" / "tensorcore" / "cublas_shapes.npz"
    with np.load(path) as z:
        data = {k: torch.from_numpy(z[k]) for k in z.files}
    h200 = get_accumulation("h200")
    shapes = sorted({k.split("|")[0] for k in data})
    assert len(shapes) == 7
    for shape in shapes:
        a, b, out = (data[f"{shape}|{x}"] for x in ("a", "b", "out"))
        assert bool(_same_bits(h200.matmul(a, b), out).all()), shape
        slices = _same_bits(ordered_gemm(a, b, ORDER["slices8-seq"]), out).flatten(1).all(1)
        assert int((~slices).sum()) >= 5, shape  # the data tells the two apart


@pytest.mark.gpu
def test_cublas_gemmex_equals_h200_and_its_gpu_twin_where_it_chains(tmp_path):
    """On the H200: cublasGemmEx (one call per matrix) at the chained shapes and at slices of 8
    next to them equals the CPU model, and gpu-h200 (kdalab's kernels) equals both."""
    # 64x64x64 is --square 64's dense row already (a second one would share its target)
    shapes = ((96, 96, 96), (1, 17, 64), (1, 48, 64), (48, 48, 48), (80, 80, 80))
    rows = _measure(tmp_path, "--square", "64", "--matrices", "8", "--runs", "2",
                    "--shapes", ",".join("x".join(map(str, sh)) for sh in shapes),
                    "--fwdsub-k", "17,63", "--candidates", "mma-k16-chain,slices8-seq")
    chain = rows.pop("Neumann chain C = 64 (model_like): runs differing from h200")
    assert chain["value"] == 0
    products = {t: r for t, r in rows.items() if "(sgemm)" not in t}  # the fp16 products
    assert len(products) == 2 + 2 + len(shapes)
    for target, r in products.items():
        assert "h200" in r["exact"], (target, r.get("note"))
    twin = get_accumulation("gpu-h200")
    g = torch.Generator().manual_seed(0)
    for m, k, n in ((64, 64, 64),) + shapes:
        scale = torch.exp2(torch.empty(8, 1, 1).uniform_(-4, 2, generator=g))
        a = (torch.randn(8, m, k, generator=g, dtype=torch.float64) * scale).half()
        b = (torch.randn(8, k, n, generator=g, dtype=torch.float64) * scale).half()
        assert bool(_same_bits(twin.matmul(a.cuda(), b.cuda()),
                               get_accumulation("h200").matmul(a, b)).all()), (m, k, n)

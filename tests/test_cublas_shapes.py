"""benchmarks/cublas_shapes.py's CPU side: the candidate orders, and that a measurement against a
cuBLAS stand-in (one candidate, computed on the CPU) names that candidate and no other."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import cublas_shapes as cs  # noqa: E402
from report import check_schema  # noqa: E402

from kdalab.arith import FP16, get_accumulation  # noqa: E402
from kdalab.arith.orders import ORDERS, Order, ordered_gemm  # noqa: E402
from kdalab.arith.tensorcore import gemmex_16f, tc_chain  # noqa: E402

ORDER = {o.name: o for o in ORDERS}


def _stand_in(order: Order):
    """cuBLAS replaced by one candidate: one 2-D fp16 product per call."""
    return lambda a, b: ordered_gemm(a[None], b[None], order)[0]


def test_orders_cut_k_as_named():
    assert ORDER["slices8-seq"].groups(24) == [[(0, 8), (8, 16), (16, 24)]]
    assert ORDER["slices8-tree"].groups(24) == [[(0, 8)], [(8, 16)], [(16, 24)]]
    assert ORDER["splitk2-k16"].groups(64) == [[(0, 16), (16, 32)], [(32, 48), (48, 64)]]
    assert ORDER["interleave2-k16"].groups(64) == [[(0, 16), (32, 48)], [(16, 32), (48, 64)]]
    assert ORDER["parts32-k8"].groups(40) == [[(0, 8), (8, 16), (16, 24), (24, 32)], [(32, 40)]]
    # equal orders at a k share one function: at k ≤ 16 every k16 order is one block
    cands = cs.candidates(16, 16, 16)
    assert cands["mma-k16-chain"] is cands["splitk4-k16-tree"] is cands["slices16-seq"]
    assert cands["slices8-seq"] is cands["slices8-tree"]  # two slices: one add either way
    wide = cs.candidates(16, 64, 16)
    assert wide["slices8-seq"] is not wide["slices8-tree"]
    assert wide["slices8-seq"] is not wide["mma-k16-chain"]


def test_orders_equal_the_library_models():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(6, 24, 48, generator=g) * 4).half().double()
    b = (torch.randn(6, 48, 24, generator=g) * 4).half().double()
    assert torch.equal(ordered_gemm(a, b, ORDER["slices8-seq"]), gemmex_16f(a, b))
    assert torch.equal(ordered_gemm(a, b, ORDER["mma-k16-chain"]),
                       tc_chain(a, b, FP16, FP16))


def test_measurement_names_the_stand_ins_order(tmp_path):
    result = cs.measure(_stand_in(ORDER["slices8-tree"]), "cpu", matrices=4, runs=2,
                        square=(32,), fwdsub_k=(24,), log=lambda s: None)
    rows = {(r["shape"], r["source"]): r for r in result["rows"]}
    assert set(rows) == {("32x32x32", "neumann"), ("32x32x32", "dense"), ("1x24x64", "fwdsub")}
    dense = rows[("32x32x32", "dense")]
    assert "slices8-tree" in dense["exact"]
    # dense operands tell a tree of four slices from the h200 model's left-to-right sum
    assert "h200" not in dense["exact"] and dense["results"]["h200"]["elements"] < 0.9
    assert all(r["results"]["slices8-tree"]["elements"] == 1.0 for r in rows.values())
    text = cs.table(result["rows"])
    assert "32x32x32 dense (4 matrices); 100 %: slices8-tree" in text
    doc = {"benchmark": "cublas_shapes", "device": "cpu", "date": "d", "commit": "c",
           "command": "x", "rows": cs.json_rows(result)}
    assert check_schema(doc, "cublas_shapes.json") == []
    # the failing shape's operands and outputs go to --raw, and replay
    path = tmp_path / "raw.npz"
    assert 0 < cs.write_raw(str(path), result) < 5_000_000
    with np.load(path) as z:
        a, b, out = (torch.from_numpy(z[f"dense_32x32x32_{x}"]) for x in ("a", "b", "out"))
        assert "32x32x32" in str(z["table_json"])
    assert torch.equal(ordered_gemm(a, b, ORDER["slices8-tree"]), out)
    assert not torch.equal(gemmex_16f(a.double(), b.double()), out)


def test_the_chain_at_64_agrees_when_the_stand_in_is_the_model():
    h200 = lambda a, b: gemmex_16f(a[None].double(), b[None].double())[0]  # noqa: E731
    result = cs.measure(h200, "cpu", matrices=2, runs=2, square=(64,), fwdsub_k=(),
                        dense=False, log=lambda s: None)
    assert result["chain"] == {"runs": 2, "differ": 0, "max_metric_diff": 0.0}
    neumann = next(r for r in result["rows"] if r["source"] == "neumann")
    assert neumann["matrices"] == 2 * 2 * 5 and "h200" in neumann["exact"]


def test_a_failing_candidate_or_source_is_reported_not_raised():
    a = torch.ones(2, 4, 20, dtype=torch.float16)
    b = torch.ones(2, 20, 4, dtype=torch.float16)

    def broken(x, y):
        raise RuntimeError("no such kernel")

    res = cs.compare(a, b, torch.full((2, 4, 4), 20.0, dtype=torch.float16),
                     {"h200": lambda x, y: gemmex_16f(x.double(), y.double()), "bad": broken})
    assert res["h200"]["elements"] == 1.0 and "no such kernel" in res["bad"]["error"]
    # emulating on another device: checked against the CPU, which takes over where it raises
    def cpu_only(x, y):
        if str(x.device) != "cpu":
            raise RuntimeError("not here")
        return gemmex_16f(x.double(), y.double())

    res = cs.compare(a, b, torch.full((2, 4, 4), 20.0, dtype=torch.float16),
                     {"h200": lambda x, y: gemmex_16f(x.double(), y.double()), "cpu": cpu_only},
                     emulate="meta", cpu_max=1)
    assert res["cpu"] == {"elements": 1.0, "matrices": 1, "of": 1, "on": "cpu"}
    result = cs.measure(broken, "cpu", matrices=2, runs=1, square=(16,), fwdsub_k=(),
                        log=lambda s: None)
    assert [r["source"] for r in result["rows"]] == ["neumann 16", "dense 16"]
    assert all("no such kernel" in r["error"] for r in result["rows"])
    assert "error" in cs.table(result["rows"])
    assert check_schema({"benchmark": "b", "device": "d", "date": "d", "commit": "c",
                         "command": "x", "rows": cs.json_rows(result)}, "b.json") == []


@pytest.mark.parametrize("name", sorted(ORDER))
def test_every_order_runs_on_a_ragged_k(name):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 41, generator=g).half()
    b = torch.randn(2, 41, 5, generator=g).half()
    out = ordered_gemm(a, b, ORDER[name])
    assert out.dtype == torch.float16 and out.shape == (2, 3, 5)
    assert torch.allclose(out.float(), (a.float() @ b.float()), atol=0.05)  # fp16 sums of 41


def test_a_spent_budget_skips_the_remaining_shapes():
    result = cs.measure(lambda a, b: a @ b, "cpu", matrices=1, runs=1, square=(16, 64),
                        fwdsub_k=(), budget_s=0.0, log=lambda s: None)
    assert [r["shape"] for r in result["rows"]] == ["neumann 64", "dense 64", "neumann 16",
                                                    "dense 16"]
    assert all(r["error"] == "skipped: time budget" for r in result["rows"])


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
        assert bool(cs.same_bits(h200.matmul(a, b), out).all()), shape
        slices = cs.same_bits(ordered_gemm(a, b, ORDER["slices8-seq"]), out).flatten(1).all(1)
        assert int((~slices).sum()) >= 5, shape  # the data tells the two apart


def test_a_dense_sweep_over_chosen_shapes_and_candidates():
    result = cs.measure(_stand_in(ORDER["mma-k16-chain"]), "cpu", matrices=3, square=(20,),
                        shapes=((1, 40, 32), (24, 24, 64)), neumann_rows=False, fwdsub_k=(),
                        only=("mma-k16-chain", "slices8-seq"), log=lambda s: None)
    rows = {(r["shape"], r["source"]): r for r in result["rows"]}
    assert set(rows) == {("20x20x20", "dense"), ("1x40x32", "dense"), ("24x24x64", "dense")}
    for r in rows.values():
        assert set(r["results"]) == {"h200", "mma-k16-chain", "slices8-seq"}
        assert "mma-k16-chain" in r["exact"]
    # the model chains at n = 64 (a multiple of 32 from 64 on) and slices below
    assert "h200" in rows[("24x24x64", "dense")]["exact"]
    assert "h200" not in rows[("20x20x20", "dense")]["exact"]


@pytest.mark.gpu
def test_cublas_gemmex_equals_h200_and_its_gpu_twin_where_it_chains():
    """On the H200: cublasGemmEx (one call per matrix) at the chained shapes and at slices of 8
    next to them equals the CPU model, and gpu-h200 (kdalab's kernels) equals both."""
    from kdalab.arith.gpu.cublas import cublas_gemm_single

    shapes = ((64, 64, 64), (96, 96, 96), (1, 17, 64), (1, 48, 64), (48, 48, 48), (80, 80, 80))
    result = cs.measure(cublas_gemm_single, "cuda", matrices=8, runs=2, square=(64,),
                        shapes=shapes, fwdsub_k=(17, 63), emulate="cuda",
                        only=("mma-k16-chain", "slices8-seq"), log=lambda s: None)
    assert len(result["rows"]) == 2 + 2 + len(shapes)
    for r in result["rows"]:
        assert "h200" in r.get("exact", ()), (r["shape"], r["source"], r.get("error"))
    assert result["chain"]["differ"] == 0
    twin = get_accumulation("gpu-h200")
    for m, k, n in shapes:
        a, b = cs.dense_operands(m, k, n, 8, seed=0)
        assert bool(cs.same_bits(twin.matmul(a.cuda(), b.cuda()),
                                 get_accumulation("h200").matmul(a, b)).all()), (m, k, n)

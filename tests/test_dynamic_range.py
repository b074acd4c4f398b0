"""Issue 5: the safe-chunk calculator, its agreement with the measured worst case, the sweep, the
diagonal-tile study and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kdalab.arith import get_format
from kdalab.cli import app
from kdalab.inputs.draw import make_inputs
from kdalab.kda.intra import boundary_log_decay, kernel_l, per_pair_l, stable_l
from kdalab.kda.recipe import SEED
from kdalab.kda.safe_chunk import (
    BOUNDARIES,
    exposed_steps,
    safe_chunk,
    scale_limits,
    weakest_lower_bound,
)
from kdalab.studies.dynamic_range import (
    DEFAULT_FORMATS,
    DEFAULT_LOWER_BOUNDS,
    SweepGrid,
    _scale_counts,
    calculator,
    run_sweep,
    worst_case_scale_table,
)

runner = CliRunner()


# --- the calculator -------------------------------------------------------------------------------

def test_seed_claim_bf16_start_is_17():
    r = safe_chunk("bf16", -5, "start")
    assert (r.max_chunk, r.max_chunk_normal) == (17, 17)
    text = "\n".join(r.explanation)
    assert "17·5 = 85" in text and "18·5 = 90" in text


@pytest.mark.parametrize("boundary,expected", [("start", 17), ("midpoint", 35), ("end", 18),
                                               ("per_pair", 18)])
def test_bf16_minus5_each_boundary(boundary, expected):
    assert safe_chunk("bf16", -5, boundary).max_chunk == expected


def test_thresholds_in_closed_form():
    bf16 = scale_limits("bf16")
    assert bf16.overflow.x == pytest.approx(128 * math.log(2) + math.log1p(-2.0**-9), abs=1e-12)
    assert bf16.zero.x == pytest.approx(126 * math.log(2) - math.log1p(-2.0**-24), abs=1e-12)
    assert "fp32" in bf16.zero.stage  # bf16's subnormals never survive the FTZ exp2
    fp16 = scale_limits("fp16")
    assert fp16.overflow.x == pytest.approx(math.log(65520.0), abs=1e-12)
    assert fp16.zero.x == pytest.approx(25 * math.log(2), abs=1e-12)
    assert fp16.subnormal.x == pytest.approx(-math.log(2.0**-14 - 2.0**-25), abs=1e-12)
    assert scale_limits("fp8_e4m3").overflow.x == pytest.approx(math.log(464.0), abs=1e-12)
    assert scale_limits("fp8_e5m2").overflow.x == pytest.approx(math.log(61440.0), abs=1e-12)
    # without the fp32 stage bf16 keeps its subnormals down to 2^-133 (zero below 2^-134)
    assert scale_limits("bf16", exp2_ftz=False).zero.x == pytest.approx(134 * math.log(2))


def test_exposed_span_matches_boundary_log_decay():
    """k(C)·|lb| is exactly the largest |G_i − G_b| the kernels' boundary exposes."""
    lb = -1.0  # integer steps: the float64 cumsum is exact
    for c in range(1, 131):
        g = torch.full((c,), lb, dtype=torch.float64).cumsum(0)[:, None]
        for b in ("start", "midpoint", "end"):
            span = (g - boundary_log_decay(g, b)).abs().max().item()
            assert span == exposed_steps(c, b) * abs(lb), (c, b)
        pair = (g - g.T).clamp(max=0).abs().max().item()
        assert pair == exposed_steps(c, "per_pair") * abs(lb)


def test_per_pair_never_overflows_and_fp16_normal_is_stricter():
    assert safe_chunk("fp16", -5, "per_pair").max_chunk_finite is None
    r = safe_chunk("fp16", -5, "start")
    assert (r.max_chunk_finite, r.max_chunk_nonzero, r.max_chunk, r.max_chunk_normal) == \
        (2, 3, 2, 1)
    assert safe_chunk("e3m4", -5, "start").max_chunk == 0  # not even one step fits


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "e6m3", "fp16-ftz"]),
       boundary=st.sampled_from(BOUNDARIES), chunk=st.integers(2, 300),
       ftz=st.booleans())
def test_weakest_lower_bound_inverts_safe_chunk(fmt, boundary, chunk, ftz):
    w = weakest_lower_bound(fmt, chunk, boundary, exp2_ftz=ftz)
    lb = w.lower_bound
    inside = safe_chunk(fmt, lb * (1 - 1e-9), boundary, exp2_ftz=ftz)
    outside = safe_chunk(fmt, lb * (1 + 1e-9), boundary, exp2_ftz=ftz)
    assert inside.max_chunk >= chunk
    assert outside.max_chunk < chunk
    lbn = w.lower_bound_normal
    assert safe_chunk(fmt, lbn * (1 - 1e-9), boundary, exp2_ftz=ftz).max_chunk_normal >= chunk
    assert safe_chunk(fmt, lbn * (1 + 1e-9), boundary, exp2_ftz=ftz).max_chunk_normal < chunk


def test_weakest_lower_bound_midpoint_c1_is_unbounded():
    assert weakest_lower_bound("bf16", 1, "midpoint").lower_bound is None


@pytest.mark.parametrize("kwargs,word", [
    ({"fmt": "bf16", "lower_bound": 0.0, "boundary": "start"}, "lower_bound"),
    ({"fmt": "bf16", "lower_bound": 1.0, "boundary": "start"}, "lower_bound"),
    ({"fmt": "bf16", "lower_bound": math.nan, "boundary": "start"}, "lower_bound"),
    ({"fmt": "bf17", "lower_bound": -5.0, "boundary": "start"}, "format"),
    ({"fmt": "bf16", "lower_bound": -5.0, "boundary": "middle"}, "boundary"),
])
def test_calculator_rejects_nonsense(kwargs, word):
    with pytest.raises(ValueError, match=word):
        safe_chunk(kwargs["fmt"], kwargs["lower_bound"], kwargs["boundary"])


# --- calculator == measurement on the worst case --------------------------------------------------

def test_calculator_agrees_with_measured_worst_case_on_the_full_grid():
    """Every lower bound of the sweep, every C = 2…128, every boundary and format, both exp2
    paths: a chunk is measured safe (no non-finite/saturated and no zero factor) exactly when the
    calculator says C ≤ max_chunk, and all-normal exactly when C ≤ max_chunk_normal."""
    formats = DEFAULT_FORMATS + ("fp16-ftz", "e6m5")
    table = worst_case_scale_table(DEFAULT_LOWER_BOUNDS, range(2, 129), formats,
                                   exp2_ftz=(True, False))
    assert len(table) == len(DEFAULT_LOWER_BOUNDS) * 127 * len(formats) * 4 * 2
    cache: dict = {}
    bad = []
    for r in table:
        key = (r["format"], r["lower_bound"], r["boundary"], r["exp2_ftz"])
        if key not in cache:
            cache[key] = safe_chunk(r["format"], r["lower_bound"], r["boundary"],
                                    exp2_ftz=r["exp2_ftz"])
        sc = cache[key]
        ok = r["overflow"] == 0 and r["zero"] == 0
        normal = ok and r["subnormal"] == 0
        if ok != (sc.max_chunk is None or r["chunk"] <= sc.max_chunk) or \
                normal != (sc.max_chunk_normal is None or r["chunk"] <= sc.max_chunk_normal):
            bad.append((key, r["chunk"], sc.max_chunk, sc.max_chunk_normal))
    assert not bad, bad[:5]
    # the grid keeps well away from the thresholds (no float32 near-ties)
    assert min(s.margin for s in cache.values()) > 1e-6


def test_seed_table_counts_reproduced():
    """The seed's exponent-boundary table: decay = 0 and reciprocal = inf counts for floor_e-5."""
    rows = {r["chunk"]: r for r in worst_case_scale_table([-5.0], [8, 16, 17, 18, 19, 32],
                                                          ["bf16"], ["start"])}
    assert [(rows[c]["zero"], rows[c]["overflow"]) for c in (8, 16, 17, 18, 19, 32)] == \
        [(0, 0), (0, 0), (0, 0), (1, 1), (2, 2), (15, 15)]


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("ftz", [True, False])
def test_vectorized_table_equals_kernel_l_counts(fmt, ftz):
    lbs = DEFAULT_LOWER_BOUNDS
    chunks = [2, 5, 16, 17, 18, 36, 64]
    table = worst_case_scale_table(lbs, chunks, [fmt], exp2_ftz=(ftz,))
    idx = {(r["lower_bound"], r["chunk"], r["boundary"]): r for r in table}
    recipe = SEED.with_(scale_format=get_format(fmt), exp2_ftz=ftz)
    lb_t = torch.tensor(lbs, dtype=torch.float64)
    for c in chunks:
        keys = torch.ones(len(lbs), c, 1, dtype=torch.bfloat16)
        log_decay = lb_t[:, None].expand(-1, c).contiguous()
        beta = torch.full((len(lbs), c), 0.5, dtype=torch.float64)
        for b in BOUNDARIES:
            cnt = _scale_counts(keys, log_decay, beta, recipe, b)
            for i, lb in enumerate(lbs):
                r = idx[(lb, c, b)]
                assert [int(cnt[k][i]) for k in ("overflow", "zero", "subnormal")] == \
                    [r["overflow"], r["zero"], r["subnormal"]], (c, b, lb)


def test_e4m3_saturation_is_counted_as_overflow():
    """exp(10) = 22026 saturates to 448 in e4m3 (no inf): the cast hides it, the count does not."""
    recipe = SEED.with_(scale_format="fp8_e4m3")
    keys = torch.ones(1, 2, 1, dtype=torch.bfloat16)
    log_decay = torch.full((1, 2), -5.0, dtype=torch.float64)
    beta = torch.full((1, 2), 0.5, dtype=torch.float64)
    kl = kernel_l(keys, log_decay, beta, recipe, "start")
    assert torch.isfinite(kl.inv_decay.double()).all() and kl.inv_decay.double().max() == 448
    cnt = _scale_counts(keys, log_decay, beta, recipe, "start")
    # exp(5) = 148 fits, exp(10) saturates; exp(-5) = 0.0067 is subnormal (tiny = 2^-6) and
    # exp(-10) = 4.5e-5 is below half of e4m3's smallest subnormal 2^-9: zero
    assert [int(cnt[k][0]) for k in ("overflow", "zero", "subnormal")] == [1, 1, 1]
    e4m3 = get_format("fp8_e4m3")
    assert e4m3.with_overflow("saturate") is e4m3 and e4m3.with_overflow("nan").torch_dtype is None


def test_per_pair_l_matches_stable_l_when_safe():
    """Per entry: bf16 factors (≤ 2⁻⁹ relative each), so |ΔL_ij| ≤ β_i·2⁻⁹·Σ_d|k_id·k_jd|, plus two
    fp16 roundings of L (≤ 2⁻¹¹ relative each, 2⁻²⁵ absolute below fp16's normals); float32
    products and sums add ~2⁻²³·D relative — covered by the factor 2 on the first term."""
    x = make_inputs("model_like", 32, 16, 1, -5.0)
    k = x.keys.double()
    absdots = (k.abs() @ k.abs().T) * x.beta[:, None]
    for g in (x.log_decay, torch.full((32, 16), -0.3, dtype=torch.float64)):
        pp = per_pair_l(x.keys, g, x.beta).l.double()
        ref = stable_l(x.keys, g, x.beta)
        bound = 2 * 2.0**-9 * absdots + 2 * 2.0**-11 * ref.abs() + 2 * 2.0**-25
        assert ((pp - ref).abs() <= torch.tril(bound, -1)).all()


# --- the sweep ------------------------------------------------------------------------------------

def test_sweep_records_and_worst_case_agreement():
    grid = SweepGrid(lower_bounds=(-1.0, -5.0, -12.0), chunks=(16, 18, 40),
                     formats=("bf16", "fp8_e4m3"), model_seeds=(0,), dim=8)
    recs = run_sweep(grid)
    assert len(recs) == 3 * 3 * 2 * 4 * 2
    for r in recs:
        sc = safe_chunk(r["format"], r["lower_bound"], r["boundary"])
        if r["family"] != "floor":  # the worst case bounds every g ∈ [lb, 0): a guarantee
            assert r["scales_ok"] or r["chunk"] > sc.max_chunk, r
            continue
        assert r["scales_ok"] == int(r["chunk"] <= sc.max_chunk), r
        if r["scales_ok"] and r["format"] == "bf16":
            assert r["l_finite"] == 1 and r["l_rel_rmse"] < 1e-2
    # the seed's C = 18 at -5: the start boundary loses a factor at both ends, per_pair does not
    r18 = {(r["boundary"]): r for r in recs if r["family"] == "floor" and r["chunk"] == 18
           and r["lower_bound"] == -5.0 and r["format"] == "bf16"}
    assert (r18["start"]["overflow"], r18["start"]["zero"]) == (1, 1)
    assert r18["per_pair"]["scales_ok"] == 1


def test_sweep_grid_rejects_nonsense():
    with pytest.raises(ValueError, match="^lower_bounds must be a finite number < 0"):
        SweepGrid(lower_bounds=(0.5,))
    with pytest.raises(ValueError, match="^boundaries must be one of start, midpoint, end, "
                                         "per_pair; got 'diag'"):
        SweepGrid(boundaries="start,diag")
    with pytest.raises(ValueError, match="^exp2_ftz must be one of on, off, both; got 'maybe'"):
        SweepGrid(exp2_ftz="maybe")
    with pytest.raises(ValueError, match="^chunks must be integers >= 2, got 1"):
        SweepGrid(chunks="1-4")


def test_calculator_records_are_the_calculators_answers():
    grid = SweepGrid(lower_bounds="-5,-0.5", chunks="4,8", formats="bf16,fp16",
                     boundaries="start,per_pair", exp2_ftz="both")
    recs = calculator(grid)
    assert len(recs) == 2 * 2 * 2 * 8  # formats × paths × boundaries × (grid ∪ table bounds)
    for r in recs:
        sc = safe_chunk(r["format"], r["lower_bound"], r["boundary"], exp2_ftz=r["exp2_ftz"])
        assert (r["max_chunk"], r["max_chunk_normal"]) == (sc.max_chunk, sc.max_chunk_normal)


# --- CLI ------------------------------------------------------------------------------------------

def test_cli_safe_chunk_text_and_json():
    res = runner.invoke(app, ["safe-chunk", "--lower-bound", "-5", "--format", "bf16",
                              "--boundary", "start"])
    assert res.exit_code == 0, res.output
    assert "max chunk: 17" in res.output
    res = runner.invoke(app, ["safe-chunk", "--lower-bound", "-5", "--format", "bf16",
                              "--boundary", "start", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.output)
    assert obj["max_chunk"] == 17 and obj["max_chunk_normal"] == 17
    assert obj["lower_bound"] == -5 and obj["format"] == "bf16" and obj["boundary"] == "start"
    res = runner.invoke(app, ["safe-chunk", "--chunk", "16", "--format", "bf16", "--json"])
    obj = json.loads(res.output)
    assert obj["weakest_lower_bound"] == pytest.approx(-87.33654481015776 / 16)
    res = runner.invoke(app, ["safe-chunk", "--lower-bound", "-5", "--format", "5,10", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["max_chunk"] == 2  # = fp16
    res = runner.invoke(app, ["safe-chunk", "--lower-bound", "-2", "--format", "e5m6",
                              "--boundary", "per_pair", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["max_chunk_finite"] is None


def test_cli_run_dynamic_range_small(tmp_path):
    res = runner.invoke(app, ["run", "dynamic-range", "--out", str(tmp_path), "--chunks", "4,18",
                              "--lower-bounds", "-1,-5", "--formats", "bf16,fp16",
                              "--model-seeds", "0", "--dim", "4", "--quiet"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "manifest.json").exists() and list(tmp_path.glob("parts/*.parquet"))
    assert list(tmp_path.glob("*.png")) and list(tmp_path.glob("*.svg"))
    # the calculator's answers drawn over the measurements are in the run folder's tables
    assert "max_chunk" in (tmp_path / "measured-limits.csv").read_text().splitlines()[0] or \
        "calculator_max_chunk" in (tmp_path / "measured-limits.csv").read_text()


# --- the diagonal-tile study ----------------------------------------------------------------------

def test_diagonal_tile_counts_and_errors():
    from kdalab.studies.diagonal_tile import count_work, run_study

    d = 8
    # one dense 16×16 tile: 2·C·D factors, C²·D GEMM multiply-adds, no scalar work
    w = count_work(16, d, "chunk_start")
    assert (w.exps, w.gemm_macs, w.dot_macs) == (2 * 16 * d, 16 * 16 * d, 0)
    # per pair: a factor and a scalar multiply-add for every (i, j, channel) of the square
    w = count_work(32, d, "per_pair")
    assert (w.exps, w.gemm_macs, w.dot_macs) == (32 * 32 * d, 0, 32 * 32 * d)
    # 16-token secondary tiles at C = 32: 3 tiles in the causal part; the off-diagonal tile is a
    # GEMM (16·D row factors + 16·D column factors), the two diagonal tiles per pair
    w = count_work(32, d, "secondary")
    assert (w.exps, w.gemm_macs, w.dot_macs) == (2 * 16 * d + 2 * 16 * 16 * d, 16 * 16 * d,
                                                 2 * 16 * 16 * d)
    recs = run_study(chunks=(16, 32), lower_bounds=(-1.0, -8.0), seeds=(0,), dim=d)
    by = {(r["family"], r["chunk"], r["strategy"], r["lower_bound"]): r for r in recs}
    # at lb = −8 the chunk-start tile of 16 fails (16·8 = 128 > 88.7) and per pair does not
    assert not by[("floor", 16, "chunk_start", -8.0)]["finite"]
    assert by[("floor", 16, "per_pair", -8.0)]["rel_rmse"] < 1e-2
    assert by[("floor", 32, "secondary-midpoint", -8.0)]["finite"]  # span 8·8 = 64
    # C = 16 is one tile: secondary (pair diagonal) is per_pair exactly
    assert by[("model_like", 16, "secondary", -1.0)]["rel_rmse"] == \
        by[("model_like", 16, "per_pair", -1.0)]["rel_rmse"]

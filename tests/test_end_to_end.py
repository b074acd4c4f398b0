"""The end-to-end study: records, determinism, non-finite cells recorded, views, CLI; its records
and the stored H200 study's gates unchanged by drawing through kdalab.inputs.sequences."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kdalab.cli import app
from kdalab.kda.chunk import prepare_for_recipe
from kdalab.records import StoreReader
from kdalab.studies.end_to_end import (
    QUICK,
    EndToEndStudy,
    StudyConfig,
    Variant,
    gate_label,
    run_study,
    study_inputs,
)

#: ATen's vectorized CPU kernels: torch's float32 randn gives the same bits under both (and
#: other bits under the generic ``default`` kernels)
VECTOR_CPU = ("AVX2", "AVX512")

TINY = replace(QUICK, families=("model_like", "saturated"), lower_bounds=(-2.0, -10.0, None),
               chunks=(8, 16), length=32, dim=16,
               variants=(Variant("flashkda", "chunk_start", "neumann"),
                         Variant("fp64", "per_pair", "exact")))


def test_records_are_deterministic_and_complete():
    a = run_study(TINY)
    b = run_study(TINY)
    assert len(a) == 2 * 3 * 2 * 2 * len(TINY.seeds)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN/inf included
    keys = {"family", "gate", "lower_bound", "seed", "chunk", "variant", "o_rel_rmse",
            "state_rel_rmse", "o_nonfinite", "state_nonfinite", "finite"}
    assert keys <= set(a[0])
    fp64 = [r for r in a if r["recipe"] == "fp64"]
    # per-pair factors never overflow: fp64 matches the fp64 recurrence (<= 1e-12, see
    # test_kda_chunk) in every family, gate and chunk size
    assert all(r["finite"] == 1 and r["o_rel_rmse"] < 1e-12 for r in fp64)


def test_nonfinite_combination_is_recorded():
    cfg = replace(TINY, families=("saturated",), lower_bounds=(-10.0,), chunks=(16,),
                  variants=(Variant("flashkda", "chunk_start", "neumann"),))
    (rec,) = run_study(cfg)
    # 16 steps at −10: exp(160) > bf16's 3.4e38 — the split exponent overflows
    assert rec["finite"] == 0 and math.isinf(rec["o_rel_rmse"]) and rec["o_nonfinite"] > 0


def test_config_validation():
    with pytest.raises(ValueError, match="^families must be one of model_like, "):
        StudyConfig(families=("nope",))
    with pytest.raises(ValueError, match="^chunks must be integers >= 1, got 0"):
        StudyConfig(chunks=(0,))
    with pytest.raises(ValueError, match="^lower_bounds must be a finite number < 0 or "
                                         "'unbounded'"):
        StudyConfig(lower_bounds="-1,2")
    assert StudyConfig(lower_bounds="-1, unbounded").lower_bounds == (-1.0, None)
    assert StudyConfig(variants="fp32/chunk_start/exact").variants == (
        Variant("fp32", "chunk_start", "exact"),)
    with pytest.raises(ValueError, match="recipe"):
        Variant.parse("fp7/chunk_start/exact")
    with pytest.raises(ValueError, match="variant"):
        Variant.parse("fp32/chunk_start")


@pytest.mark.parametrize("change,says", [
    (dict(heads=100_000), "^heads 100000, long_length 256, dim 32 and chunks up to 64: one "
                          "family's tensors need at least"),
    (dict(length=99_999_999_999, families=("model_like",)), "^heads 1, length 99999999999, dim 32"),
])
def test_a_study_too_large_for_memory_is_refused_naming_its_fields(change, says):
    # the API refuses what the command line refuses (naming the fields, not the options),
    # when the study is made: nothing has run or been allocated
    with pytest.raises(ValueError, match=says):
        EndToEndStudy(replace(QUICK, **change))
    EndToEndStudy(QUICK)  # the quick study fits


def test_cli_quick_writes_records_tables_and_plots(tmp_path):
    out = tmp_path / "e2e"
    res = CliRunner().invoke(app, [
        "run", "end-to-end", "--quick", "--families", "model_like,long", "--chunks", "8,64",
        "--lower-bounds", "-5,unbounded", "--long-length", "64", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = StoreReader.read_only(out, kind="end-to-end").records()
    assert len(recs) == 2 * 2 * 2 * len(QUICK.variants)
    for name in ("e2e_output_table.md", "e2e_output_table.csv", "e2e_state_table.md",
                 "e2e_summary.csv", "e2e_gate_chunk.png", "e2e_gate_chunk.svg",
                 "e2e_output_vs_chunk_lbm5.png", "manifest.json"):
        assert (out / name).exists(), name
    assert "∞" in (out / "e2e_output_table.md").read_text()  # chunk_start at C = 64 overflows


#: Records of a small end-to-end study computed on the CPU by the study's own draws, before the
#: study drew through kdalab.inputs.sequences (the code of commit ce5268f, `kdalab run
#: end-to-end` with the stored manifest's config): data from before the change. Its variants are
#: FlashKDA's H200 twins, whose every product is exact integer arithmetic (kdalab.arith.
#: tensorcore), so their bf16 outputs are the same bits on every CPU; the torch-order recipes
#: (flashkda, fp32) sum in MKL's float32 order, which differs between CPUs.
BEFORE = Path(__file__).parent / "data" / "end_to_end_before"
#: The end-to-end study of the docs, computed on the H200 with the study's former draws.
H200_STUDY = Path(__file__).parents[1] / "docs" / "figures" / "end-to-end"
#: Fields that are float64 reductions: the errors against the fp64 recurrence and the mean
#: log-decay, compared within METRIC_RTOL; every other field must be equal.
REDUCED = ("o_rel_rmse", "state_rel_rmse", "log_decay_mean")
#: The fp64 reference recurrence (96 steps of K = 16 products) rounds its last bits by the CPU's
#: vector width and MKL's code path: about T·K·u ≈ 2e-13 of ‖ref‖, which moves an error
#: m = ‖o − ref‖/‖ref‖ by 2e-13·(1 + m)/m relative, 5e-11 at the smallest m here (4.8e-3); a
#: float64 mean of up to 3072 terms moves by n·u ≈ 3.4e-13. 1e-9 leaves 20x headroom, and a
#: single bf16 output element rounded the other way moves m by about 1e-4 relative.
METRIC_RTOL = 1e-9


def _bits(x):
    return float(x).hex() if isinstance(x, float) else x


def _differences(got: dict, want: dict) -> list[str]:
    """What differs beyond what another CPU may change: a reduced field beyond METRIC_RTOL (or
    finite on one side only), any other field at all."""
    out = []
    for k in sorted(want):
        a, b = got[k], want[k]
        if k in REDUCED and math.isfinite(b):
            if not (math.isfinite(a) and abs(a - b) <= METRIC_RTOL * abs(b)):
                out.append(f"{k}: {a!r} vs {b!r}")
        elif _bits(a) != _bits(b):
            out.append(f"{k}: {a!r} vs {b!r}")
    return out


@pytest.mark.exact
def test_records_equal_those_computed_before_the_study_drew_through_inputs_sequences():
    """The study's records, recomputed with the draws of kdalab.inputs.sequences, equal the
    stored records computed by the study's former draws (tests/data/end_to_end_before): every
    field exactly but the float64 reductions, those within METRIC_RTOL. The inputs must be the
    same bits: torch's float32 randn rounds otherwise under ATen's generic kernels
    (ATEN_CPU_CAPABILITY=default), so there the comparison cannot hold and is skipped
    (tests/test_inputs.py checks the draws against stored digests where they are reproducible)."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in VECTOR_CPU:
        pytest.skip(f"ATen CPU capability {cap}: float32 randn rounds otherwise than under "
                    f"{'/'.join(VECTOR_CPU)}, where the stored records were made")
    store = StoreReader.read_only(BEFORE, kind="end-to-end")
    config = {k: v for k, v in store.manifest.config.items() if k != "device"}
    assert all("-h200/" in v for v in config["variants"])
    want = store.records()
    got = run_study(StudyConfig(**config))
    assert len(got) == len(want) == 8 * 6
    assert 0 < sum(r["finite"] for r in want) < len(want)  # overflowing cells are compared too

    def key(r):
        return r["family"], r["variant"], r["chunk"], r["gate"], r["seed"]

    want = {key(r): r for r in want}
    assert {key(r): _differences(r, want[key(r)]) for r in got} == {key(r): [] for r in got}


def test_the_record_comparison_can_fail():
    rec = next(r for r in StoreReader.read_only(BEFORE, kind="end-to-end").records()
               if r["finite"])
    assert _differences(dict(rec), rec) == []
    assert _differences(dict(rec, o_rel_rmse=rec["o_rel_rmse"] * (1 + 1e-11)), rec) == []
    for k, v in (("o_rel_rmse", rec["o_rel_rmse"] * (1 + 1e-6)), ("state_rel_rmse", math.inf),
                 ("log_decay_min", math.nextafter(rec["log_decay_min"], 0)),
                 ("o_nonfinite", rec["o_nonfinite"] + 1), ("variant", "fp32/per_pair/exact")):
        assert [d.split(":")[0] for d in _differences(dict(rec, **{k: v}), rec)] == [k]


def test_the_stored_h200_study_saw_the_gates_the_presets_draw():
    """docs/figures/end-to-end was computed on the H200 with the study's former draws. Its
    records cannot be recomputed bit for bit on the CPU (other arithmetic, and a cell at its
    shape takes tens of seconds here), but each record carries its inputs' gate statistics:
    the presets' draws give every one of its 48 (family, gate, seed) gates the very minimum
    log-decay (a minimum does not depend on reduction order) and the mean to 1e-15 relative
    (a float64 sum of 262144 to 1048576 terms in another order; 3.5e-16 at worst measured)."""
    if torch.backends.cpu.get_cpu_capability() not in VECTOR_CPU:
        pytest.skip("ATen's generic CPU kernels round float32 randn otherwise than the "
                    "AVX2/AVX512 kernels the stored study's inputs were drawn with")
    store = StoreReader.read_only(H200_STUDY, kind="end-to-end")
    cfg = StudyConfig(**{k: v for k, v in store.manifest.config.items() if k != "device"})
    stored = {(r["family"], r["gate"], r["seed"]): (r["log_decay_mean"], r["log_decay_min"])
              for r in store.records()}
    seen = 0
    for family in cfg.families:
        for lb in cfg.lower_bounds:
            for seed in cfg.seeds:
                kw = study_inputs(family, lb, seed, cfg.seq_len(family), cfg.heads, cfg.dim)
                g = prepare_for_recipe(**kw, recipe="fp64").log_decay
                mean, low = stored[family, gate_label(lb), seed]
                assert float(g.amin()) == low, (family, lb, seed)
                assert float(g.mean()) == pytest.approx(mean, rel=1e-15, abs=0)
                seen += 1
    assert seen == len(stored) == 48

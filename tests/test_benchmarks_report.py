"""docs/BENCHMARKS.md is generated from benchmarks/results/*.json (benchmarks/report.py): every
result file has the schema, and the page is exactly what the files give, so the two cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import report  # noqa: E402


def test_every_result_file_has_the_schema():
    results = report.load()
    assert results, "no benchmark results"
    for data in results:
        assert report.check_schema(data, data["benchmark"]) == []


def test_the_page_is_what_the_results_give():
    text = report.render(report.load())
    assert report.PAGE.read_text(encoding="utf-8") == text, (
        "docs/BENCHMARKS.md is stale: run python benchmarks/report.py")
    assert text.count("\n") <= 250


@pytest.mark.parametrize("broken", [
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k", "rows": []},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k",
     "rows": [{"target": "t", "value": "fast", "unit": "x"}]},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "command": "k",
     "rows": [{"target": "t", "value": 1.0, "unit": "x", "when": "today"}]},
    {"benchmark": "x", "device": "d", "date": "t", "commit": "c", "rows": [
        {"target": "t", "value": 1.0, "unit": "x"}]},
])
def test_the_schema_check_can_fail(broken):
    assert report.check_schema(broken, "x.json") != []


def test_collect_keeps_a_candidates_bits_and_adds_no_interval_note_twice(tmp_path):
    # the serving rows as bench_decode writes them (a candidate's bits check in the note of its
    # speed-up row) and as collect_h200 folds them into the page: the bits stay readable, and
    # a checkpoint-interval note already on a kept row is not added again
    import bench_decode
    import collect_h200

    short = [dict(shape="S", kdalab_ms=1.0, vs_flashkda=0.98, vs_fla=2.0,
                  guard_launch_over_default=1.041, guard_launch_same_bits=False,
                  kend_single_over_default=1.1, kend_single_same_bits=True,
                  stage1_default_ms=0.457, stage1_kend_single_ms=0.418, flashkda_ms=0.98,
                  kdalab_graph_ms=0.9, kdalab_host_us=250.4, flashkda_host_us=80.0,
                  launch_triton_over_default=1.25, launch_triton_same_bits=True,
                  launch_triton_host_us=301.2)]
    dec = [dict(N=1, H=12, kdalab_ms=0.01, kdalab_graph_ms=0.005, floor_ms=0.004,
                kdalab_host_us=20.2, kdalab_triton_launch_host_us=60.7,
                kdalab_triton_launch_ms=0.061, fla_host_us=40.0, over_floor_graph=1.25)]
    rows = bench_decode.to_json_rows(4.2e12, dec, [], short)
    notes = {r["target"]: r.get("note") for r in rows}
    # the host's time a call and the graph replay, in the FlashKDA row's note only
    assert notes["prefill S: kdalab vs flashkda"] == (
        "kdalab 1.000 ms; [host 250 us a call against FlashKDA's 80; CUDA-graph replay "
        "0.900 ms, 1.089x FlashKDA's eager 0.980]")
    assert notes["prefill S: kdalab vs fla"] == "kdalab 1.000 ms"
    assert notes["prefill S: kdalab [guard_launch] speed-up over the default"] == "other bits"
    assert notes["prefill S: kdalab [kend_single] speed-up over the default"] == "the same bits"
    assert notes["prefill S: kdalab [launch_triton] speed-up over the default"] == (
        "the same bits; host 301 us a call against the default's 250")
    assert notes["decode N=1 H=12: kdalab"] == (
        "graph 5.00 us, floor 4.00 us; host 20 us a call, 61 through Triton's launch path "
        "(eager 61.00 us), fla 40")
    assert "prefill S: stage 1 [kend_single]" in notes
    folded = collect_h200.fold_short([r for r in rows if "stage 1" not in r["target"]])
    note = next(r["note"] for r in folded if r["target"] == "prefill S: kdalab vs flashkda")
    assert "guard_launch 1.041x (other bits)" in note and "fla 2.0x" in note
    path = tmp_path / "ck.jsonl"
    path.write_text('{"shape": "S", "ck128_graph_x": 1.1, "ck256_graph_x": 1.05}\n')
    ck = [dict(target="prefill S: ck64_over_plain", value=1.2, unit="x", note="plain 1 ms")]
    once = collect_h200.note_ck_intervals(ck, path, "abc1234")
    twice = collect_h200.note_ck_intervals(once, path, "abc1234")
    assert once == twice and once[0]["note"].count("every 128 / 256 tokens") == 1


def test_collect_folds_the_decode_part_one_row_a_shape():
    # the three rows bench_decode writes a decode shape become the page's one, every figure
    # kept; a shape without fla keeps kdalab's own row
    import collect_h200

    rows = [dict(target="H200 copy bandwidth (1 GiB d2d)", value=4.2, unit="TB/s"),
            dict(target="decode N=8 H=48: kdalab", value=57.68, unit="us",
                 note="graph 11.53 us, floor 12.02 us; host 49 us a call"),
            dict(target="decode N=8 H=48: vs fla fused_recurrent_kda", value=0.683, unit="x",
                 note="graph replay 1.414x"),
            dict(target="decode N=8 H=48: graph time over memory floor", value=0.959,
                 unit="x"),
            dict(target="decode N=1 H=12: kdalab", value=70.0, unit="us", note="graph 3 us"),
            dict(target="decode N=1 H=12: graph time over memory floor", value=7.6, unit="x")]
    out = collect_h200.decode_rows(rows)
    assert [r["target"] for r in out] == [
        "H200 copy bandwidth (1 GiB d2d)",
        "decode N=8 H=48: kdalab vs fla fused_recurrent_kda (eager)",
        "decode N=1 H=12: kdalab (eager)"]
    assert out[1]["value"] == 0.683 and out[1]["note"] == (
        "graph replay 1.414x; kdalab eager 57.68 us, graph 11.53 us, floor 12.02 us; host 49 "
        "us a call; graph 0.959x the floor")
    assert out[2]["value"] == 70.0 and out[2]["unit"] == "us"


def test_decode_rows_carry_the_launch_shapes_and_the_bf16_pool():
    # the launch shapes bench_decode times beside the default, and a bf16 pool, reach the
    # kdalab row's note (graph replay, us); a row without them has no such note
    import bench_decode

    r = dict(N=64, H=48, kdalab_ms=0.1116, kdalab_graph_ms=0.1094, floor_ms=0.0962,
             over_floor_graph=1.137, kdalab_graph_ms_bv32_w2=0.1091,
             kdalab_graph_ms_bv64_w4=0.1035, kdalab_graph_ms_bf16_pool=0.0825,
             fla_graph_ms_bf16_pool=0.0971)
    bare = {k: v for k, v in r.items() if "bv" not in k and "bf16" not in k}
    mine, plain = (bench_decode.to_json_rows(4.2e12, [x], [], [])[1] for x in (r, bare))
    assert mine["note"] == ("graph 109.40 us, floor 96.20 us; graph us at BV/warps 32/2 109.10, "
                            "64/4 103.50; bf16 pool graph 82.50 us (fla 97.10)")
    assert plain["note"] == "graph 109.40 us, floor 96.20 us"


def test_collect_folds_the_pool_part_and_notes_the_stagger_once(tmp_path):
    # the pool's and the bf16 pool's ratios go into the note of the shape's 64-token row;
    # a pool part's raw stagger figures are added there once
    import json

    import collect_h200

    rows = [dict(target="prefill S: pool_over_plain", value=1.005, unit="x", note="p"),
            dict(target="prefill S: ck64_over_plain", value=1.208, unit="x", note="plain 1 ms"),
            dict(target="prefill S: ck64_bf16_over_plain", value=1.097, unit="x", note="b"),
            dict(target="prefill S: kdalab vs flashkda", value=1.03, unit="x", note="k")]
    folded = collect_h200.fold_pool(rows)
    assert [r["target"] for r in folded] == ["prefill S: ck64_over_plain",
                                             "prefill S: kdalab vs flashkda"]
    assert folded[0]["note"] == "plain 1 ms; pool alone 1.005x, a bf16 pool's checkpoints 1.097x"
    assert collect_h200.fold_pool(folded) == folded
    path = tmp_path / "decode.raw.json"
    path.write_text(json.dumps({"pool": [dict(
        shape="S", ck64_over_plain=1.2075, ck64_stagger600_over_plain=1.2107,
        ck64_stagger1200_over_plain=1.212, stagger600_same_bits=True,
        stagger1200_same_bits=True)]}))
    once = collect_h200.note_ck_stagger(folded, path, "abc1234")
    assert once == collect_h200.note_ck_stagger(once, path, "abc1234")
    assert once[0]["note"].endswith("[starts staggered 600/1200 ns: 1.211/1.212x against "
                                    "1.208x unstaggered in that run, the same bits; pruned, "
                                    "at abc1234]")
    assert once[1] == folded[1]


def test_collect_keeps_earlier_runs_notes_on_the_64_token_rows():
    # the bracketed notes of other runs ([... at COMMIT]) on the page's 64-token rows reach
    # the new run's rows of the same shape, once each and in order; other notes and other
    # rows are not carried, and a shape the page lacked gets nothing
    import collect_h200

    before = [dict(target="prefill S: ck64_over_plain", value=1.2, unit="x",
                   note="plain 1 ms; pool alone 1.0x; [starts staggered 600 ns: 1.211x "
                        "against 1.208x unstaggered in that run, the same bits; pruned, at "
                        "1afa292]; [every 128 / 256 tokens 1.1x / 1.05x: graph replay at "
                        "36a6ecd]"),
              dict(target="prefill S: kdalab vs flashkda", value=1.0, unit="x",
                   note="[x at abc1234]")]
    rows = [dict(target="prefill S: ck64_over_plain", value=1.21, unit="x", note="plain 2 ms"),
            dict(target="prefill U: ck64_over_plain", value=1.3, unit="x", note="plain 3 ms"),
            dict(target="prefill S: kdalab vs flashkda", value=1.1, unit="x", note="k")]
    out = collect_h200.note_earlier(rows, before)
    assert out[0]["note"] == (
        "plain 2 ms; [starts staggered 600 ns: 1.211x against 1.208x unstaggered in that run, "
        "the same bits; pruned, at 1afa292]; [every 128 / 256 tokens 1.1x / 1.05x: graph "
        "replay at 36a6ecd]")
    assert out[1:] == rows[1:]
    assert collect_h200.note_earlier(out, before) == out

"""kdalab hunt --resume: the numbering continues, the reports cover every trial, a split hunt is
reproducible for the same split, a torn last record is dropped, a hunt of another configuration
or a folder without a hunt is refused (exit 2) and left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdalab.cli import main
from kdalab.hunt.search import sampler_seed

#: tiny shapes, as tests/test_hunt.py: a trial takes a few hundredths of a second on the CPU
SMALL = ("--device", "cpu", "--max-T", "40", "--max-heads", "2", "--dims", "16,32", "--quiet",
         "--seed", "3", "--gates", "lower_bound")


def hunt(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(["hunt", *args])
    return done.value.code, capsys.readouterr().err


def _lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]


def _trials(folder: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "elapsed_s")}
            for r in _lines(folder)]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """recipe:flashkda, seed 3: twice 4 trials then --resume 4 more, and once 8 unsplit."""
    root = tmp_path_factory.mktemp("resume")
    codes = {}
    for name in ("a", "b"):
        for extra in ((), ("--resume",)):
            with pytest.raises(SystemExit) as done:
                main(["hunt", "recipe:flashkda", *SMALL, "--trials", "4", *extra,
                      "--out", str(root / name)])
            codes[name, bool(extra)] = done.value.code
    with pytest.raises(SystemExit) as done:
        main(["hunt", "recipe:flashkda", *SMALL, "--trials", "8", "--out", str(root / "whole")])
    codes["whole"] = done.value.code
    return root, codes


def test_resume_continues_the_numbering_and_never_repeats_a_draw(split):
    root, codes = split
    assert all(c in (0, 1) for c in codes.values()), codes
    trials = _trials(root / "a")
    assert [t["trial"] for t in trials] == list(range(8))
    assert len({t["seed"] for t in trials}) == 8
    # the resumed sampler is not the first run's again: its random start draws other parameters
    assert all(trials[i + 4]["params"] != trials[i]["params"] for i in range(4))
    elapsed = [r["elapsed_s"] for r in _lines(root / "a")]
    assert elapsed == sorted(elapsed)  # the search's seconds, summed over both runs


def test_a_split_hunt_is_reproducible_for_the_same_split(split):
    root, _ = split
    assert _trials(root / "a") == _trials(root / "b")  # every trial, timings aside
    assert (root / "a" / "worst.json").read_bytes() == (root / "b" / "worst.json").read_bytes()
    # up to the split it is the unsplit hunt; after it the sampler's seed differs (documented)
    whole = _trials(root / "whole")
    assert _trials(root / "a")[:4] == whole[:4]
    assert _trials(root / "a")[4:] != whole[4:]


def test_the_reports_cover_every_trial(split):
    root, _ = split
    meta = json.loads((root / "a" / "hunt.json").read_text())
    assert meta["trials_run"] == 8 and meta["counts"]["measured"] == 8
    assert meta["trials"] == 4  # this run's limit: what it added
    assert [r["first_trial"] for r in meta["runs"]] == [0, 4]
    assert meta["date"] == meta["runs"][0]["date"]  # the first run's, on top
    # hunt.json rounds to 0.1 s, and its clock stops a moment after the last trial's
    assert meta["elapsed_s"] == pytest.approx(_lines(root / "a")[-1]["elapsed_s"], abs=0.1)
    worst = json.loads((root / "a" / "worst.json").read_text())
    assert worst["output_error"] == max(t["output_error"] for t in _trials(root / "a"))
    report = (root / "a" / "report.md").read_text()
    assert "8 trials" in report and "2 runs" in report
    assert (root / "a" / "progress.png").exists()


def test_the_sampler_seed_of_a_fresh_hunt_is_the_hunt_seed():
    assert sampler_seed(3, 0) == 3 and sampler_seed(0, 0) == 0
    assert len({sampler_seed(3, n) for n in range(1, 20)} | {3}) == 20
    assert sampler_seed(3, 5) == sampler_seed(3, 5) != sampler_seed(4, 5)


_PLANTED = '''
import os
import kdalab.kda as kda

def bad_while_flagged(q, k, v, g, beta, *, use_qk_l2norm=True, **kw):
    o, s = kda.forward(q, k, v, g, beta, recipe="fp32", **kw)
    return (o * 0 if os.path.exists(os.environ["KDALAB_TEST_FLAG"]) else o), s
'''


def test_the_worst_case_of_an_earlier_run_stays_the_worst(tmp_path, capsys, monkeypatch):
    planted, flag = tmp_path / "planted.py", tmp_path / "flag"
    planted.write_text(_PLANTED)
    monkeypatch.setenv("KDALAB_TEST_FLAG", str(flag))
    target, out = f"{planted}:bad_while_flagged", str(tmp_path / "out")
    flag.write_text("")
    code, _ = hunt(capsys, target, *SMALL, "--trials", "2", "--out", out)
    assert code == 1
    flag.unlink()  # the kernel is exact from now on: this run alone finds nothing
    code, _ = hunt(capsys, target, *SMALL, "--trials", "3", "--resume", "--out", out)
    assert code == 1  # the verdict covers all trials
    worst = json.loads((tmp_path / "out" / "worst.json").read_text())
    assert worst["trial"] in (0, 1) and worst["output_error"] == pytest.approx(1.0)
    trials = _trials(tmp_path / "out")
    assert [t["trial"] for t in trials] == list(range(5))
    assert all(t["output_error"] < 1e-3 for t in trials[2:])
    assert all(t["best_output_error"] == pytest.approx(1.0) for t in trials)


def test_a_torn_last_record_is_dropped(tmp_path, capsys):
    out = tmp_path / "out"
    code, _ = hunt(capsys, "recipe:fp32", *SMALL, "--trials", "3", "--out", str(out))
    assert code == 0
    whole = (out / "trials.jsonl").read_text()
    with open(out / "trials.jsonl", "a") as f:
        f.write(whole.splitlines()[0][:37])  # a kill in the middle of trial 3's line
    # the options left out are the hunt's: TARGET and the run's limit are enough
    code, _ = hunt(capsys, "recipe:fp32", "--quiet", "--trials", "2", "--resume", "--out",
                   str(out))
    assert code == 0
    trials = _lines(out)  # every line whole JSON again
    assert [t["trial"] for t in trials] == list(range(5))
    assert (out / "trials.jsonl").read_text().startswith(whole)
    meta = json.loads((out / "hunt.json").read_text())
    assert meta["trials_run"] == 5 and meta["seed"] == 3 and meta["bounds"]["max_T"] == 40
    assert all(t["spec"]["K"] in (16, 32) for t in trials)


def test_reading_without_repair_leaves_the_file_as_it_was(tmp_path, capsys):
    # a replay reads another's hunt (scripts/replay_hunt.py): the same records as a resume
    # reads, the torn last line dropped, a missing last newline not added, no byte changed
    from kdalab.hunt.files import read_trials

    out = tmp_path / "out"
    hunt(capsys, "recipe:fp32", *SMALL, "--trials", "2", "--out", str(out))
    whole = (out / "trials.jsonl").read_text()
    for text in (whole + whole.splitlines()[0][:37], whole.rstrip("\n")):
        (out / "trials.jsonl").write_text(text)
        assert [t["trial"] for t in read_trials(out, repair=False)] == [0, 1]
        assert (out / "trials.jsonl").read_text() == text
    (out / "trials.jsonl").write_text('{"not": "a trial"}\n' + whole)
    with pytest.raises(ValueError, match="^line 1 of"):  # not a --resume's message
        read_trials(out, repair=False)


def test_a_damaged_record_before_the_last_is_an_error(tmp_path, capsys):
    out = tmp_path / "out"
    hunt(capsys, "recipe:fp32", *SMALL, "--trials", "3", "--out", str(out))
    lines = (out / "trials.jsonl").read_text().splitlines()
    damaged = "\n".join([lines[0], lines[1][:20], lines[2]]) + "\n"
    (out / "trials.jsonl").write_text(damaged)
    code, err = hunt(capsys, "recipe:fp32", *SMALL, "--trials", "1", "--resume", "--out",
                     str(out))
    assert code == 2 and "line 2" in err and len(err.strip().splitlines()) == 1
    assert (out / "trials.jsonl").read_text() == damaged


@pytest.fixture(scope="module")
def fp32_hunt(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp32") / "out"
    with pytest.raises(SystemExit) as done:
        main(["hunt", "recipe:fp32", *SMALL, "--trials", "2", "--out", str(out)])
    assert done.value.code == 0
    return out


@pytest.mark.parametrize("args, needle", [
    (["recipe:flashkda"], "TARGET differs"),
    (["recipe:fp32", "--seed", "4"], "--seed differs"),
    (["recipe:fp32", "--threshold", "0.5"], "--threshold differs"),
    (["recipe:fp32", "--max-T", "48"], "--max-T differs"),
    (["recipe:fp32", "--dims", "16"], "--dims differs"),
    (["recipe:fp32", "--lower-bound", "-2:-1"], "--lower-bound differs"),
])
def test_resuming_another_configuration_is_refused(args, needle, fp32_hunt, capsys):
    out = fp32_hunt  # (shared: a refusal leaves it as it was, which the test asserts)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = hunt(capsys, args[0], *SMALL, "--trials", "1", "--resume", "--out", str(out),
                     *args[1:])
    assert code == 2 and err.strip().startswith("error: --resume:") and needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # left as it was


def test_resume_without_a_hunt_is_refused(tmp_path, capsys):
    code, err = hunt(capsys, "recipe:fp32", *SMALL, "--trials", "1", "--resume", "--out",
                     str(tmp_path / "missing"))
    assert code == 2 and "holds no hunt" in err and "without --resume" in err
    assert not (tmp_path / "missing").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, err = hunt(capsys, "recipe:fp32", *SMALL, "--trials", "1", "--resume", "--out",
                     str(foreign))
    assert code == 2 and "holds no hunt" in err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_a_resumed_time_budget_counts_the_trials_it_adds(tmp_path, capsys):
    out = tmp_path / "out"
    hunt(capsys, "recipe:fp32", *SMALL, "--trials", "2", "--out", str(out))
    code, _ = hunt(capsys, "recipe:fp32", *SMALL, "--budget-s", "1", "--resume", "--out",
                   str(out))
    meta = json.loads((out / "hunt.json").read_text())
    assert code == 0 and meta["budget_s"] == 1.0 and meta["trials"] is None
    assert meta["trials_run"] == len(_lines(out)) > 2
    assert meta["runs"][1]["first_trial"] == 2


def test_unmeasured_trials_are_replayed_and_the_numbering_checked():
    from kdalab.hunt import Bounds, HuntConfig, Target, resolve, run_hunt

    exact = resolve("recipe:fp32", "cpu")
    target = Target("t", "cpu", run=exact.run,
                    why_not=lambda x: "T > 30" if x["q"].shape[1] > 30 else None)
    cfg = HuntConfig("t", trials=4, budget_s=None,
                     bounds=Bounds(max_T=40, max_heads=1, dims=(16,)))
    first = run_hunt(cfg, target=target)
    statuses = {r["status"] for r in first.records}
    assert statuses == {"measured", "unsupported"}  # (seed 0 draws both: the test needs both)
    again = run_hunt(cfg, target=target, history=first.records)
    assert [r["trial"] for r in again.records] == list(range(8))
    assert again.records[:4] == first.records
    assert sum(again.counts.values()) == 8
    with pytest.raises(ValueError, match="not numbered 0, 1"):
        run_hunt(cfg, target=target, history=first.records[1:])

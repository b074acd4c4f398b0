"""The one parse of every parameter (kdalab.params): the list grammar, the lower bound, models,
formats, devices and paths; one message shape everywhere, naming the argument as given."""

from __future__ import annotations

import math

import pytest
import torch

from kdalab import params
from kdalab.errors import Unavailable


def test_int_list_grammar():
    assert params.int_list("3-8", "seeds") == (3, 4, 5, 6, 7, 8)
    assert params.int_list("4,12,16", "chunks") == (4, 12, 16)
    assert params.int_list("0-2,5", "seeds") == (0, 1, 2, 5)
    assert params.int_list("36-48:4", "chunks") == (36, 40, 44, 48)
    assert params.int_list("2-4,36-44:4", "chunks") == (2, 3, 4, 36, 40, 44)
    assert params.int_list([1, "3-4"], "seeds") == (1, 3, 4)
    assert params.int_list(7, "dims") == (7,)
    assert params.int_list(" 8 , 8,16", "chunks") == (8, 16)  # duplicates dropped, order kept
    assert params.int_list("-3--1", "x") == (-3, -2, -1)


@pytest.mark.parametrize("bad,message", [
    ("3-x", "seeds: cannot read '3-x'; expected integers like"),
    ("", "seeds has an empty item"),
    ("8-3", "seeds: the range '8-3' is reversed; write it from low to high, '3-8'"),
    ("1,,2", "seeds has an empty item"),
    ("2-8:0", "seeds: cannot read '2-8:0'"),
    ("1.5", "seeds: cannot read '1.5'"),
    ([True], "seeds must hold integers"),
    ("-1", "seeds must be integers >= 0, got -1"),
    ([], "seeds is empty"),
])
def test_int_list_refuses_with_one_message(bad, message):
    with pytest.raises(ValueError) as err:
        params.int_list(bad, "seeds", minimum=0)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_lower_bound_one_rule_everywhere():
    assert params.lower_bound("-5") == -5.0 and params.lower_bound(-1e-30) == -1e-30
    for bad in (0, 0.5, "x", math.inf, -math.inf, math.nan, True, None, "-inf"):
        with pytest.raises(ValueError, match=r"^--lower-bound must be a finite number < 0 \(the "
                                             r"log-decay lies in \(lower_bound, 0\)\), got "):
            params.lower_bound(bad, "--lower-bound")
    assert params.lower_bounds("-5,-2", "lb") == (-5.0, -2.0)
    assert params.lower_bounds("-1,unbounded", "lb", unbounded=True) == (-1.0, None)
    with pytest.raises(ValueError, match=r"^lb must be a finite number < 0 \(.*\), got 0$"):
        params.lower_bounds("-1,0", "lb")
    with pytest.raises(ValueError, match="or 'unbounded'"):
        params.lower_bounds("-1,x", "lb", unbounded=True)
    with pytest.raises(ValueError, match="needs a bound"):
        params.lower_bounds("unbounded", "lb")


def test_accumulation_models_and_where_they_run():
    m = params.accumulation("h200")
    assert m.name == "h200" and params.accumulation(m) is m
    assert [x.name for x in params.accumulations("fp16-seq,fp32,fp16-seq")] == ["fp16-seq", "fp32"]
    with pytest.raises(ValueError, match="^--accumulation: unknown accumulation model 'fp12'"):
        params.accumulation("fp12", "--accumulation")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="runs on CUDA tensors only"):
            params.accumulation("gpu-h200", "accumulation", "cpu")
    else:
        with pytest.raises(Unavailable, match=r"'gpu-h200' is the GPU's own arithmetic and "
                                              r"needs a CUDA device.*its CPU emulation is 'h200'"):
            params.accumulation("gpu-h200")
        with pytest.raises(ValueError) as err:
            params.accumulation("cublas-16f")
        assert "gpu-h200" not in str(err.value)  # no model this machine cannot run is offered


def test_formats_devices_and_choices():
    assert params.scale_format("bf16").name == "bf16"
    assert params.scale_format("5,10").exp_bits == 5 and params.scale_format((4, 3)).man_bits == 3
    with pytest.raises(ValueError, match="^--format: unknown format 'bf17'"):
        params.scale_format("bf17", "--format")
    assert params.device("cpu") == "cpu"
    with pytest.raises(ValueError, match="^--device must be cpu, cuda or cuda:N; got 'tpu'"):
        params.device("tpu", "--device")
    if not torch.cuda.is_available():
        with pytest.raises(Unavailable, match="no CUDA device"):
            params.device("cuda")
    with pytest.raises(ValueError, match="^--boundary must be one of start, end; got 'mid'"):
        params.choice("mid", "--boundary", ("start", "end"))


def test_paths(tmp_path):
    out = params.output_folder(tmp_path / "a" / "b", "--out")
    assert out.is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a folder"):
        params.output_folder(tmp_path / "f", "--out")
    with pytest.raises(ValueError, match="cannot create the folder"):
        params.output_folder(tmp_path / "f" / "sub", "--out")
    assert params.config_file(tmp_path / "f") == tmp_path / "f"
    with pytest.raises(ValueError, match="is a folder; expected a file"):
        params.config_file(tmp_path, "config")
    with pytest.raises(ValueError, match="no such file"):
        params.config_file(tmp_path / "nope.toml", "config")


def test_paths_expand_home_and_refuse_what_is_no_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert params.output_folder("~/x", "out") == tmp_path / "x" and (tmp_path / "x").is_dir()
    (tmp_path / "c.toml").write_text("")
    assert params.config_file("~/c.toml") == tmp_path / "c.toml"
    for bad, message in ((5, r"out must be a path \(text\), got 5"), (True, "must be a path"),
                         (["a"], "must be a path"), ("", "out is empty"), ("  ", "out is empty")):
        with pytest.raises(ValueError, match=message):
            params.output_folder(bad, "out")


def test_lists_and_sweeps_are_counted_before_they_are_built():
    assert len(params.int_list(f"0-{params.MAX_ITEMS - 1}", "--seeds")) == params.MAX_ITEMS
    for huge in ("0-99999999999", f"0-{params.MAX_ITEMS}", f"0-{params.MAX_ITEMS // 2},"
                 f"{params.MAX_ITEMS}-{2 * params.MAX_ITEMS}"):
        with pytest.raises(ValueError, match="--seeds: .* holds more than 1,000,000 items"):
            params.int_list(huge, "--seeds")
    assert params.run_count([3, 10, 1000]) == 30_000
    with pytest.raises(ValueError, match="--seeds: the sweep would plan 30,000,000 runs"):
        params.run_count([3, 10, 1_000_000])


def test_an_output_folder_can_be_checked_without_making_it(tmp_path):
    from kdalab import params

    target = tmp_path / "a" / "b"
    assert params.output_folder(target, "--out", create=False) == target
    assert not (tmp_path / "a").exists()  # checked by making it, then removed again
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--out: cannot create the folder .*Not a directory"):
        params.output_folder(tmp_path / "file" / "sub", "--out", create=False)
    with pytest.raises(ValueError, match="--out: .* is a file"):
        params.output_folder(tmp_path / "file", "--out", create=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_integers_beyond_64_bits_are_named_where_asked():
    from kdalab import params

    with pytest.raises(ValueError, match=r"--seeds: 18446744073709551616 is too large"):
        params.int_list(str(2**64), "--seeds")
    with pytest.raises(ValueError, match=r"--seeds: 9223372036854775808 is too large"):
        params.int_list(f"0-{2**63}", "--seeds")
    assert params.int_list(str(2**63 - 1), "--seeds") == (2**63 - 1,)
    with pytest.raises(ValueError, match="--seed: .* is too large"):
        params.integer(2**70, "--seed", 0, int64=True)
    assert params.integer(2**70, "--chunk", 1) == 2**70  # safe-chunk answers huge sizes itself
    with pytest.raises(ValueError, match="--out: cannot expand '~nosuchuser-kdalab/x'"):
        params.user_path("~nosuchuser-kdalab/x", "--out")

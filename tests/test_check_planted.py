"""`kdalab check` judged by what it fails: broken kernels of every kind, planted in a file of
their own and run through the command line's one boundary. None of them may pass, none may
end in a traceback, and each leaves a report that says what it did."""

from __future__ import annotations

import textwrap

import pytest

from kdalab.cli import main

PLANTED = textwrap.dedent('''
    import torch

    def raises(q, k, v, g, beta, **kw):
        raise RuntimeError("boom: not built")

    def import_fails(q, k, v, g, beta, **kw):
        import kdalab_no_such_module_xyz  # noqa: F401

    def returns_none(q, k, v, g, beta, **kw):
        return None

    def wrong_shape(q, k, v, g, beta, **kw):
        return torch.zeros(1), None

    def nan_everywhere(q, k, v, g, beta, initial_state=None, **kw):
        n, _, h, d = q.shape
        cu = kw.get("cu_seqlens")
        n = n if cu is None else len(cu) - 1
        return (torch.full_like(v, float("nan")),
                torch.full((n, h, d, v.shape[-1]), float("nan"), device=v.device))

    def declines_all(q, k, v, g, beta, **kw):
        raise NotImplementedError("nothing supported")
''')


def _check(capsys, tmp_path, name):
    path = tmp_path / "planted.py"
    path.write_text(PLANTED)
    out = tmp_path / f"out-{name}"
    try:
        main(["check", f"{path}:{name}", "--device", "cpu", "--suite", "quick",
              "--cases", "model_like,T/1,varlen/*,contract/causal/*", "--out", str(out),
              "--quiet"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr(), out


@pytest.mark.parametrize("name", ["raises", "import_fails", "returns_none", "wrong_shape",
                                  "nan_everywhere", "declines_all"])
def test_a_broken_kernel_never_passes(name, capsys, tmp_path):
    code, cap, out = _check(capsys, tmp_path, name)
    assert code == 1, (code, cap.err)
    assert "Traceback" not in cap.err
    report = (out / "report.md").read_text()
    assert "FAIL" in report
    if name == "declines_all":  # nothing ran: unsupported everywhere, and that fails
        assert "no case ran" in report or "0 of" in report
    elif name != "nan_everywhere":
        # what it did is in the report, case by case
        needle = {"raises": "boom: not built", "import_fails": "kdalab_no_such_module_xyz",
                  "returns_none": "NoneType", "wrong_shape": "of shape [1]"}[name]
        assert needle in report

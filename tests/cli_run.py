"""The command line run in this process, for the tests of its mistakes and outputs."""

from __future__ import annotations

import pytest

from kdalab.cli import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``kdalab ARGS`` through the CLI's boundary: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return done.value.code, out, err

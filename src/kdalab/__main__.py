"""``python -m kdalab``: the command line."""

from kdalab.cli import run

run()

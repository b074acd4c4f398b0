#!/usr/bin/env python3
"""Make a Ray wheel small enough to carry to the device machine (its tree travels under 64 MiB).

Ray 2.60's manylinux wheel is 79 MB; 32 MB of it are Java jars (``ray/jars``), which a Python
driver and Python workers never load, and a few MB are libraries kdalab does not import (RLlib,
Ray LLM, the dashboard's web client: the sweep starts Ray without a dashboard). This copies
the wheel without them (and without their lines in RECORD, so pip installs it as usual)::

    python3 scripts/device/trim_ray_wheel.py .whl-ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl

The trimmed wheel replaces the original in place. tests of the trimmed wheel: install it with
``pip install --no-deps --target DIR`` and run a Ray task (``--check``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DROP = ("ray/jars/", "ray/rllib/", "ray/llm/", "ray/dashboard/client/")


def trim(path: Path) -> tuple[int, int]:
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED,
                                                      compresslevel=9) as dst:
        for info in src.infolist():
            if info.filename.startswith(DROP):
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(DROP)).encode()
            dst.writestr(info, data)
    before = path.stat().st_size
    os.replace(tmp, path)
    return before, path.stat().st_size


def check(path: Path) -> None:
    """Install the wheel into a temporary folder and run one Ray task from there."""
    with tempfile.TemporaryDirectory() as site:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-index", "--no-compile", "--target", site, str(path)], check=True)
        code = ("import ray; ray.init(num_cpus=1, include_dashboard=False); "
                "f = ray.remote(lambda x: x + 1); assert ray.get(f.remote(1)) == 2; "
                "print('ray', ray.__version__, 'from', ray.__file__, 'ran a task')")
        env = dict(os.environ, PYTHONPATH=site)
        subprocess.run([sys.executable, "-c", code], check=True, env=env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("--check", action="store_true", help="install it and run a Ray task "
                   "(needs a wheel for this machine's Python)")
    args = p.parse_args()
    before, after = trim(args.wheel)
    print(f"{args.wheel.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    if args.check:
        check(args.wheel)


if __name__ == "__main__":
    main()

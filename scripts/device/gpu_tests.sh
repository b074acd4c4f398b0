#!/usr/bin/env bash
# Every GPU test of the suite (tests marked `gpu`), on the device machine, from the repository
# root; fails on any failure, error or skip (a GPU test that skips on a GPU machine is a bug).
#   bash scripts/device/gpu_tests.sh [extra pytest args, test paths among them]
# Writes $OUT/gpu_tests.xml (JUnit) when $OUT is set. Needs fla-core (the test extra):
# installed, or its wheel carried in .whl/.
set -o pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# the test extra's fla-core (tests compare against its naive recurrence): from the carried .whl/
if ! python3 -c "import fla" 2>/dev/null && ls .whl/fla_core-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/fla_core-*.whl
fi
report=${OUT:-/tmp}/gpu_tests.xml
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 > "${OUT:-/tmp}/gpu_name.txt"
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_tests.sh: no CUDA device')" || exit 2
# test paths among the arguments take the place of the whole folder (given beside it, pytest
# ran the folder: every file's GPU tests, then the named file's, cut off at a call's limit)
where=(tests)
for a in "$@"; do case $a in tests/*) where=() ;; esac; done
python3 -m pytest -q -p no:cacheprovider -m gpu -v -rfEs --durations=25 --junitxml="$report" "${where[@]}" "$@"
status=$?
python3 benchmarks/junit_outcomes.py "$report" || status=1
exit $status

#!/usr/bin/env bash
# Device call 4 of session 3 (2026-11-30 00:05 UTC, run as this one command line): what call 3
# (session3_final.sh) left when its kernel benchmark hit its time limit — H = 96 varlen speed
# of the default and the accuracy of the default and the tf32 configuration beside fla.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
timeout 290 python3 benchmarks/bench_kernel.py --shapes 96v --configs default --accuracy \
    --accuracy-configs default,tf32 --json $OUT/bench_kernel.json 2>&1 \
    | tee $OUT/bench_kernel_96v_acc.log

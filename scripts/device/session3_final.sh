#!/usr/bin/env bash
# Device call 3 of session 3 (2026-11-29 23:59 UTC): the new kernel default (fp16 products with the
# range guard, 2-warp stage 1) — GPU kernel tests, speed at the four shapes against
# the earlier tf32 default, the unguarded fp16 path and fla, accuracy side by side with fla;
# issue 3 — the GPU sweep benchmark with draw processes by default. Carry .whl.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k gpu 2>&1 \
    | tee $OUT/pytest_kernels.log | tail -4
timeout 100 python3 benchmarks/bench_gpu_sweep.py --out $OUT 2>&1 | tee $OUT/bench_gpu_sweep.log
timeout 330 python3 benchmarks/bench_kernel.py --configs default,no_guard \
    --accuracy --accuracy-configs default,tf32 \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log

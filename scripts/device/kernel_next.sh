#!/usr/bin/env bash
# Device call 1 of session 3 (2026-11-29 23:36 UTC; written in session 2): the GPU tests
# (FAST_CONFIG among them), then FAST_CONFIG and the default timed end to end at the issue's
# four shapes, accuracy, stage split. Carry .whl (fla-core). Logs to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k gpu 2>&1 \
    | tee $OUT/pytest_kernels.log | tail -4
timeout 330 python3 benchmarks/bench_kernel.py --configs default,fast,fast_tf32x3,t_fp16,prep_w4,prep_w2 \
    --accuracy --accuracy-configs default,fast --stages --stage-configs default,fast,fast_tf32x3,prep_w2 \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log

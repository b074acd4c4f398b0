#!/usr/bin/env bash
# Device call 5 of session 3 (2026-11-30): issue 6's "another split" — the one-pass forward
# (KernelConfig(variant="fused")) under the GPU tests, and timed against the two-stage default
# from short to long sequences (B·T = 8192, H = 64; bench_kernel.py --split). No fla needed.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gpu_fused" 2>&1 \
    | tee $OUT/pytest_fused.log | tail -4
timeout 120 python3 benchmarks/bench_kernel.py --skip-speed --split --json $OUT/bench_split.json \
    2>&1 | tee $OUT/bench_split.log

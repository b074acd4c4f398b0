#!/usr/bin/env bash
# Device call 1 of session 5 (kind nvidia-h200, nothing carried): stage 1 in blocks of key
# columns against all columns at once. The launch choices of bench_kernel.py --explore (whole
# forward, and stage 1 alone for every stage-1 variant) on the shapes where stage 1 is most
# of the time, then the accuracy table (the plan's stage 1 on every path; fla skipped: not
# installed here), then the GPU tests of the kernels.
set -o pipefail
export PYTHONUNBUFFERED=1 COLUMNS=200
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 330 python3 benchmarks/bench_kernel.py --explore \
    --shapes T8192_H64,B8_T4096_H32_state,varlen1024x8_H64,T1024_H16,T8192_H96,varlen6_H64 \
    --json "$OUT/explore.json" 2>&1 | grep -v '^{'
timeout 100 python3 benchmarks/bench_kernel.py --accuracy --json "$OUT/accuracy.json" 2>&1 \
    | grep -v skipped
OUT=$OUT timeout 200 bash scripts/device/gpu_tests.sh 2>&1 | tail -n 15

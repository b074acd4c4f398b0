#!/usr/bin/env bash
# Session 5 (kind nvidia-h200, carry .whl and .peers): the kernel on shapes beyond the grid
# (bench_kernel.py --extra: shapes the plan's constants were not measured on) against fla and
# FlashKDA in one process, fla's configurations compiled in parallel first.
set -o pipefail
source scripts/device/peers.sh
export COLUMNS=200
timeout 200 python3 benchmarks/bench_kernel.py --warm-peers --extra --jobs 7 2>&1 \
    | grep -v skipped | grep -v '^{"shape'
timeout 150 python3 benchmarks/bench_kernel.py --grid --extra --json "$OUT/extra.json" 2>&1 \
    | grep -v '^{"shape'

#!/usr/bin/env bash
# Device call 1 of session 4 (issue 7, the kernel): GPU tests of the new paths, where a short
# call's time goes, kdalab's launch choices and parts on the whole grid (to calibrate the
# plan's cost model), accuracy of the serial and split paths. Carry .whl and .peers.
#   bash scripts/device/kernel_explore.sh
set -o pipefail
source scripts/device/peers.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 bash scripts/device/gpu_tests.sh -x 2>&1 | tail -n 25 | tee $OUT/gpu_tests.log
timeout 120 python3 benchmarks/bench_kernel.py --overhead --json $OUT/overhead.json 2>&1 | tail -n 12
timeout 420 python3 benchmarks/bench_kernel.py --explore --json $OUT/explore.json 2>&1 | tee $OUT/explore.log | tail -n 14
timeout 120 python3 benchmarks/bench_kernel.py --accuracy --json $OUT/accuracy.json 2>&1 | tail -n 4

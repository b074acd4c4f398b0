#!/usr/bin/env bash
# Device call 1b of session 4 (issue 7): GPU tests of the new paths, where a short call's time
# goes, kdalab's launch choices and parts on the whole grid (to calibrate kernels/plan.py),
# accuracy of the serial and split paths. Carry .whl and .peers (flash_kda_build.tar from 1a).
set -o pipefail
source scripts/device/peers.sh
timeout 200 bash scripts/device/gpu_tests.sh -k "segments or guard or planned or transition or families_fixed" 2>&1 | tail -n 20 | tee $OUT/gpu_tests.log
timeout 60 python3 benchmarks/bench_kernel.py --overhead --json $OUT/overhead.json 2>&1 | tail -n 8
timeout 270 python3 benchmarks/bench_kernel.py --explore --json $OUT/explore.json 2>&1 | tee $OUT/explore.log | tail -n 11
timeout 60 python3 benchmarks/bench_kernel.py --accuracy --json $OUT/accuracy.json 2>&1 | tail -n 4

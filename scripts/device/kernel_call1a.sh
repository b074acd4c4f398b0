#!/usr/bin/env bash
# Device call 1a of session 4: FlashKDA built in the background while fla's autotuner warms up
# on every grid shape (GPU otherwise idle, so its choices are clean; the choices are saved for
# the next call); then FlashKDA's golden data (scripts/device/flashkda_golden.py, the
# flashkda helper's). Carry .whl and .peers.
set -o pipefail
export PEERS_BUILD=background
source scripts/device/peers.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 330 python3 benchmarks/bench_kernel.py --warm-peers 2>&1 | tee $OUT/warm_fla.log | grep -v '"skipped"' | tail -n 12
peers_save_autotune
peers_wait
timeout 200 python3 scripts/device/flashkda_golden.py --out $OUT 2>&1 | tee $OUT/flashkda_golden.log | tail -n 25
ls -la $OUT

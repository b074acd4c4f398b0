#!/usr/bin/env bash
# Device call 2 of session 4 (kind nvidia-h200-x2): the session's figures, in two parts (two
# commands on the warm machine). Carry .whl and .peers (fla-core; FlashKDA's carried build with its
# package; fla's autotuning choices).
#   FINAL_PART=1: two lanes at once —
#     lane A, GPU 0 (the timings): fla's configurations compiled in parallel, fla's autotuning
#       shape by shape on an otherwise idle GPU, then the grid (kdalab, fla, FlashKDA, one
#       process: benchmarks/bench_kernel.py --grid);
#     lane B, GPU 1 (nothing timed): the tanh.approx tables for the flashkda model, every GPU
#       test (gpu_tests.sh), then `kdalab check` on the full suite (check_h200.sh).
#   (FINAL_PART=2, the accuracy table beside the sweep's figures, is superseded by
#   stage1_call.sh, which runs the accuracy table, and sweep_remeasure.sh.)
#   FINAL_PART=grid (session 5, kind nvidia-h200, carry .whl and .peers): lane A alone, the
#     kernel grid after stage 1's new load order.
# With one GPU the lanes run one after the other.
set -o pipefail
source scripts/device/peers.sh
export COLUMNS=200
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
mkdir -p /tmp/final
gpu_b=$(( ngpu > 1 ? 1 : 0 ))
both() {  # run lane functions $1 and $2, at once on two GPUs
    if [ "$ngpu" -gt 1 ]; then
        $2 > "/tmp/final/$2.log" 2>&1 &
        local pid=$!
        $1 2>&1 | tee "/tmp/final/$1.log"
        wait $pid
        tail -n 40 "/tmp/final/$2.log"
    else
        $1 2>&1 | tee "/tmp/final/$1.log"
        $2 2>&1 | tee "/tmp/final/$2.log"
    fi
}
lane_a1() {
    export CUDA_VISIBLE_DEVICES=0
    timeout 300 python3 benchmarks/bench_kernel.py --warm-peers --jobs 10 2>&1 | grep -v skipped
    peers_save_autotune
    timeout 230 python3 benchmarks/bench_kernel.py --grid --json /tmp/final/grid.json
}
lane_b1() {
    export CUDA_VISIBLE_DEVICES=$gpu_b
    mkdir -p /tmp/sweeps && timeout 120 python3 scripts/device/flashkda_golden.py \
        --out /tmp/sweeps --only-sweeps 2>&1 | tail -n 5
    tar cf "$OUT/sweeps.tar" -C /tmp sweeps
    OUT=/tmp/final timeout 260 bash scripts/device/gpu_tests.sh
    # fla's autotuning here stays out of the shared cache: lane A's choices are its own
    # (CHECK_PEERS=0: this shell has the peers already; a second install into /tmp/site
    # would replace files lane A is importing)
    OUT=/tmp/final CHECK_PEERS=0 FLA_CACHE_RESULTS=0 CHECK_BUDGET=190 \
        bash scripts/device/check_h200.sh
}
part=${FINAL_PART:-1}
if [ "$part" = grid ]; then
    lane_a1 2>&1 | tee /tmp/final/lane_a1.log | grep -v '^{"shape'
    cp /tmp/final/grid.json "$OUT/"
elif [ "$part" = 1 ]; then
    both lane_a1 lane_b1
    [ -f /tmp/final/check.tar.gz ] && mv /tmp/final/check.tar.gz "$OUT/"
else
    echo "final_call.sh: FINAL_PART must be 1 or grid" >&2
    exit 2
fi
tar czf "$OUT/final$part.tar.gz" -C /tmp final
ls -la "$OUT"

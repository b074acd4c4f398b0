#!/usr/bin/env bash
# Device call 2 of session 4: every figure of the session's issues in one call.
# Carry .whl and .peers (fla-core wheel, FlashKDA source and its carried build, fla's
# autotuning choices). Two lanes when the machine has two GPUs (nvidia-h200-x2):
#   lane A, GPU 0 (the timings): fla's configurations compiled in parallel, then fla's
#     autotuning shape by shape on an idle GPU, then the grid (kdalab, fla, FlashKDA, same
#     process) and the accuracy table;
#   lane B, GPU 1 (no timing of the kernels): every GPU test, then `kdalab check` on the full
#     suite; then the sweep engine's whole-command benchmark.
# With one GPU the lanes run one after the other (FINAL_LANES=A or B picks one).
#   bash scripts/device/final_call.sh
set -o pipefail
source scripts/device/peers.sh
export COLUMNS=200
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
mkdir -p /tmp/final
lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    timeout 300 python3 benchmarks/bench_kernel.py --warm-peers --jobs 10 2>&1 | grep -v skipped
    peers_save_autotune
    timeout 240 python3 benchmarks/bench_kernel.py --grid --json /tmp/final/grid.json
    timeout 90 python3 benchmarks/bench_kernel.py --accuracy --json /tmp/final/accuracy.json
}
lane_b() {
    export CUDA_VISIBLE_DEVICES=$(( ngpu > 1 ? 1 : 0 ))
    OUT=/tmp/final timeout 240 bash scripts/device/gpu_tests.sh
    # fla's autotuning here is kept out of the shared cache: lane A's choices stay its own
    OUT=/tmp/final FLA_CACHE_RESULTS=0 CHECK_BUDGET=260 bash scripts/device/check_h200.sh
    if [ -f scripts/device/sweep_h200.sh ]; then
        OUT=/tmp/final timeout 150 bash scripts/device/sweep_h200.sh
    fi
}
lanes=${FINAL_LANES:-AB}
if [ "$ngpu" -gt 1 ] && [ "$lanes" = AB ]; then
    lane_b > /tmp/final/lane_b.log 2>&1 &
    pid_b=$!
    lane_a 2>&1 | tee /tmp/final/lane_a.log
    wait $pid_b
    tail -n 60 /tmp/final/lane_b.log
else
    case $lanes in *A*) lane_a 2>&1 | tee /tmp/final/lane_a.log ;; esac
    case $lanes in *B*) lane_b 2>&1 | tee /tmp/final/lane_b.log ;; esac
fi
if [ "$ngpu" -gt 1 ] && [ -f scripts/device/ray_2gpu.sh ]; then
    OUT=/tmp/final timeout 150 bash scripts/device/ray_2gpu.sh 2>&1 | tee /tmp/final/ray.log | tail -n 15
fi
[ -f /tmp/final/check.tar.gz ] && mv /tmp/final/check.tar.gz "$OUT/"
tar czf "$OUT/final.tar.gz" -C /tmp final
ls -la "$OUT"

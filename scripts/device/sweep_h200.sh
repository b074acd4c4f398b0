#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200), in one call: `kdalab sweep` as a whole process
# against the seed's own loop timed in the same benchmark process.
#   GPU: 3 families x C = 2..64 x 500 seeds = 94,500 runs, --device cuda --accumulation h200
#        (targets: >= 60x the seed loop, <= 8 s), 3 whole-process runs (the first one cold),
#        then the phases timed in-process (--breakdown).
#   CPU of the same host, for the record: fp16-seq (3,072 runs, target >= 5x) and the h200
#        model (768 runs, target <= 10x the seed's CPU time).
# Run from the repo root (no carried files needed; about 4 minutes):
#     bash scripts/device/sweep_h200.sh
# Output: RESULT lines on stdout; the whole log in $OUT/sweep_h200.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BENCH="python3 benchmarks/bench_sweep_whole.py whole"
{
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, os; print('torch', torch.__version__, '|', os.cpu_count(), 'CPUs')"
    $BENCH --device cuda --accumulation h200 --chunks 2-64 --seeds 0-499 --seed-sample 4 \
        --repeat 3 --breakdown
    $BENCH --device cpu --accumulation fp16-seq --chunks 2-64:2 --seeds 0-31 --repeat 2
    $BENCH --device cpu --accumulation h200 --chunks 2-64:2 --seeds 0-7 --seed-sample 2 \
        --repeat 1
} 2>&1 | tee "$OUT/sweep_h200.log"

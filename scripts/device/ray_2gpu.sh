#!/usr/bin/env bash
# Issue 15 on two H200s of one host (kind nvidia-h200-x2): the sweep's throughput through Ray
# with 1 and with 2 GPUs (target: near 2x), against the local backend on one GPU, and a check
# that every store holds the local backend's records bit for bit.
#   3 families x C = 2..64 x 2,000 seeds = 378,000 runs, --device cuda --accumulation h200;
#   each configuration first runs a small warm-up sweep (starts Ray's workers and their draw
#   processes), then the timed one. Ends with the whole command on both GPUs for the record.
# The machine has no Ray: carry it as wheels in .whl-ray/ (see docs/BENCHMARKS.md, "Ray
# wheels": the official ray 2.60.0 cp312 wheel trimmed by scripts/device/trim_ray_wheel.py,
# plus jsonschema, jsonschema-specifications, referencing, rpds-py; 43 MB together).
# Run from the repo root, carry [".whl-ray"] (about 4 minutes):
#     bash scripts/device/ray_2gpu.sh
# Output: RESULT lines on stdout; the whole log in $OUT/ray_2gpu.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl-ray/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
    python3 -c "import torch, ray, os; print('torch', torch.__version__, '| ray', ray.__version__, '|', os.cpu_count(), 'CPUs')"
    python3 benchmarks/bench_sweep_whole.py ray --device cuda --accumulation h200 \
        --chunks 2-64 --seeds 0-1999 --gpus 1,2
    rm -rf /tmp/sweep_ray
    /usr/bin/time -f "whole command, --backend ray on every GPU: %e s" python3 -c \
        "import sys; from kdalab.cli import main; sys.argv[0] = 'kdalab'; main()" sweep \
        --chunks 2-64 --seeds 0-1999 --device cuda --accumulation h200 --backend ray \
        --out /tmp/sweep_ray --quiet
} 2>&1 | tee "$OUT/ray_2gpu.log"

#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200, nothing carried): the start of a CUDA process, the
# 94,500-run sweep's phases in one process (benchmarks/bench_sweep_phases.py), then the whole
# `kdalab sweep` command three times against the seed's loop (bench_sweep_whole.py), and twice
# without its helper processes (KDALAB_NO_HELPERS=1), then torch's slowest imports.
# Run from the repo root: bash scripts/device/sweep_phases.sh   (about 3 minutes)
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
date -u +"%Y-%m-%d %H:%M UTC"; git log -1 --format="commit %h" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do
    /usr/bin/time -f "python + import torch: %e s" python3 -c "import torch"
    /usr/bin/time -f "python + import torch + CUDA init: %e s" \
        python3 -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
done
/usr/bin/time -f "python -m kdalab --help: %e s" python3 -m kdalab --help > /dev/null
timeout 300 python3 benchmarks/bench_sweep_phases.py ${PHASES_ARGS:-}
timeout 200 python3 benchmarks/bench_sweep_whole.py whole --device cuda --accumulation h200 \
    --chunks 2-64 --seeds 0-499 --seed-sample 4 --repeat ${REPEAT:-3}
echo "== without helper processes"
KDALAB_NO_HELPERS=1 timeout 200 python3 benchmarks/bench_sweep_whole.py whole --device cuda \
    --accumulation h200 --chunks 2-64 --seeds 0-499 --seed-sample 2 --repeat 2
python3 -X importtime -c "import torch" 2> /tmp/importtime.txt
echo "torch's imports, slowest by own time, then by cumulative time (us):"
sed 's/^import time: *//' /tmp/importtime.txt | sort -t'|' -k1 -n -r | head -12
sed 's/^import time: *//' /tmp/importtime.txt | sort -t'|' -k2 -n -r | head -20

#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200, nothing carried): where a CUDA process's start goes
# (scripts/device/startup_probe.py), torch's and kdalab's slowest imports, then the whole
# `kdalab sweep` command (94,500 runs) against the seed's loop with its timeline.
# Run from the repo root: bash scripts/device/startup_probe.sh   (about 4 minutes)
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
date -u +"%Y-%m-%d %H:%M UTC"; git log -1 --format="commit %h" 2>/dev/null; uname -r; nproc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import typer, torch, sys; print('python', sys.version.split()[0], 'typer', typer.__version__, 'torch', torch.__version__)"
timeout 300 python3 scripts/device/startup_probe.py ${REPS:-3}
python3 -X importtime -c "import torch" 2> /tmp/importtime.txt
echo "torch's imports, slowest by own time, then by cumulative time (us):"
sed 's/^import time: *//' /tmp/importtime.txt | sort -t'|' -k1 -n -r | head -15
sed 's/^import time: *//' /tmp/importtime.txt | sort -t'|' -k2 -n -r | head -25
python3 -X importtime -c "import kdalab.cli" 2> /tmp/importtime_cli.txt
echo "kdalab.cli's imports by cumulative time (us):"
sed 's/^import time: *//' /tmp/importtime_cli.txt | sort -t'|' -k2 -n -r | head -12
timeout 200 python3 benchmarks/bench_sweep_whole.py whole --device cuda --accumulation h200 \
    --chunks 2-64 --seeds 0-499 --seed-sample 4 --repeat ${REPEAT:-3}

#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200): the whole `kdalab sweep` command (94,500 runs)
# against the seed's loop, variants interleaved over rounds after one untimed run that fills a
# fresh machine's caches. Each variant is Python run in the command's process first
# (bench_sweep_whole.py --prelude); "default" is the command as it is.
# Run from the repo root: ROUNDS=3 bash scripts/device/sweep_ab.sh NAME=CODE ...
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
date -u +"%Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name --format=csv,noheader; uname -r
axes="--device cuda --accumulation h200 --chunks 2-64 --seeds 0-499"
python3 -m kdalab sweep $axes --out /tmp/sweep_warm --quiet
for round in $(seq 1 "${ROUNDS:-3}"); do
    for variant in "default=" "$@"; do
        echo "== round $round, variant ${variant%%=*}"
        timeout 120 python3 benchmarks/bench_sweep_whole.py whole $axes --seed-sample 4 \
            --repeat 1 --prelude "${variant#*=}" | grep -v "^whole process"
    done
done

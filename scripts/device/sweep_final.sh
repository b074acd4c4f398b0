#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200; carry .whl for the GPU tests' fla-core): the whole
# `kdalab sweep` command (94,500 runs) against the seed's loop, after one untimed run that fills
# the fresh machine's caches, three rounds of three variants interleaved: the command as it is
# (3 draw servers on 16 cores), with 2 draw servers, and with none (draws on a thread of the
# command's process); then every GPU test (scripts/device/gpu_tests.sh).
# Run from the repo root: bash scripts/device/sweep_final.sh   (about 5 minutes)
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
date -u +"%Y-%m-%d %H:%M UTC"; git log -1 --format="commit %h" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
axes="--device cuda --accumulation h200 --chunks 2-64 --seeds 0-499"
KDALAB_TIMELINE=1 python3 -m kdalab sweep $axes --out /tmp/sweep_warm --quiet
for round in 1 2 3; do
    for servers in default 2 0; do
        prelude=""
        [ "$servers" != default ] && prelude="from kdalab.experiments import helper; helper.draw_servers = lambda: $servers"
        echo "== round $round, draw servers: $servers"
        timeout 120 python3 benchmarks/bench_sweep_whole.py whole $axes --seed-sample 4 \
            --repeat 1 --prelude "$prelude"
    done
done
bash scripts/device/gpu_tests.sh

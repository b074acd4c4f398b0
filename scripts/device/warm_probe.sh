#!/usr/bin/env bash
# Issue 15 on one H200 (kind nvidia-h200): the CUDA sweep's warm-up and views step by step
# (scripts/device/warm_probe.py), twice each in fresh processes, around the whole command.
# Run from the repo root: bash scripts/device/warm_probe.sh   (about 2 minutes)
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
date -u +"%Y-%m-%d %H:%M UTC"; git log -1 --format="commit %h" 2>/dev/null
for i in 1 2; do echo "warm-up, process $i"; python3 scripts/device/warm_probe.py warm; done
out=$(mktemp -d)/sweep
KDALAB_TIMELINE=1 python3 -m kdalab sweep --device cuda --accumulation h200 --chunks 2-64 \
    --seeds 0-499 --out "$out" --quiet
for i in 1 2; do echo "views, process $i"; python3 scripts/device/warm_probe.py views "$out"; done

#!/usr/bin/env bash
# Issue 15, one call on two H200s of one host (kind nvidia-h200-x2), carry [".whl-ray"]
# (Ray 2.60.0 trimmed by scripts/device/trim_ray_wheel.py, and its four dependencies):
#   (a) `kdalab sweep` as a whole process, twice, against the seed's loop timed in the same
#       benchmark, and its phases in-process (--breakdown): 3 families x C = 2..64 x 500 seeds
#       = 94,500 runs, --device cuda --accumulation h200, on GPU 0 (targets: >= 60x the seed
#       loop, <= 8 s);
#   (b) the same sweep over 1,000 seeds (189,000 runs) on the local backend (one GPU), then
#       through a local Ray cluster of 1 and of 2 GPUs (target: near 2x), every store checked
#       bit for bit against the local backend's records.
# The configurations of final_call.sh's part 2. Ray installs into /tmp/site while (a) runs.
# Run from the repo root (about 3 minutes; (a) is cut at 120 s, (b) at what is left of 235 s):
#     bash scripts/device/sweep_remeasure.sh
# Output: a summary at the end of stdout; the logs in $OUT/sweep_remeasure.tar.gz.
# For a check of the script's logic on a CPU: DEVICE=cpu ACCUMULATION=fp16-seq CHUNKS=2-8
# SEEDS_WHOLE=0-3 SEEDS_RAY=0-7 (Ray's sizes then count CPUs).
set -uo pipefail
START=$SECONDS
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cuda}
ACCUMULATION=${ACCUMULATION:-h200}
CHUNKS=${CHUNKS:-2-64}
SEEDS_WHOLE=${SEEDS_WHOLE:-0-499}
SEEDS_RAY=${SEEDS_RAY:-0-999}
GPUS=${GPUS:-1,2}
BUDGET=${BUDGET:-235}
LOGS=$(mktemp -d /tmp/sweep_remeasure.XXXX)
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BENCH="python3 benchmarks/bench_sweep_whole.py"
AXES=(--device "$DEVICE" --accumulation "$ACCUMULATION" --chunks "$CHUNKS")

{
    date -u +"%Y-%m-%d %H:%M UTC"
    command -v nvidia-smi >/dev/null && \
        nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
    python3 -c "import torch, os; print('torch', torch.__version__, '|', os.cpu_count(), 'CPUs')"
} 2>&1 | tee "$LOGS/machine.log"

# Ray's wheels unpacked in the background, while (a) runs on GPU 0
if ls .whl-ray/ray-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl-ray/*.whl > "$LOGS/ray_install.log" 2>&1 &
    RAY_INSTALL=$!
else
    echo "no .whl-ray/ carried: Ray as installed here, if it is" > "$LOGS/ray_install.log"
    RAY_INSTALL=
fi

echo "== (a) the whole command, $SEEDS_WHOLE seeds, twice"
CUDA_VISIBLE_DEVICES=0 timeout 120 $BENCH whole "${AXES[@]}" --seeds "$SEEDS_WHOLE" \
    --seed-sample 4 --repeat 2 --breakdown 2>&1 | tee "$LOGS/whole.log"
echo "(a) exit ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$LOGS/whole.log"

[ -n "$RAY_INSTALL" ] && { wait "$RAY_INSTALL" || echo "Ray's install failed"; }
cat "$LOGS/ray_install.log"
LEFT=$(( BUDGET - (SECONDS - START) ))
echo "== (b) local vs Ray on $GPUS GPUs, $SEEDS_RAY seeds ($LEFT s left)"
if python3 -c "import ray" 2>>"$LOGS/ray_install.log"; then
    timeout $(( LEFT > 30 ? LEFT : 30 )) $BENCH ray "${AXES[@]}" --seeds "$SEEDS_RAY" \
        --gpus "$GPUS" 2>&1 | tee "$LOGS/ray.log"
    echo "(b) exit ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$LOGS/ray.log"
else
    echo "(b) skipped: Ray does not import" | tee "$LOGS/ray.log"
fi

tar czf "$OUT/sweep_remeasure.tar.gz" -C "$LOGS" .
echo "== summary ($((SECONDS - START)) s in all)"
python3 - "$LOGS" <<'EOF'
import re, sys
from pathlib import Path

logs = Path(sys.argv[1])
whole = (logs / "whole.log").read_text()
runs = [float(s) for s in re.findall(r"kdalab sweep, run \d+: ([\d.]+) s", whole)]
result = re.search(r"RESULT whole .*", whole)
seed = re.search(r"seed loop ([\d.]+) ms/run", whole)
core = re.search(r"sweep into the store ([\d.]+) s \(([\d.]+) ms/run\)", whole)
print("(a) whole command, s per run of the benchmark:", runs or "none finished")
print("   ", result.group(0) if result else "no RESULT line (see whole.log)")
if core:
    line = f"    in-process sweep into the store: {core.group(1)} s = {core.group(2)} ms/run"
    if seed:
        line += f", {float(seed.group(1)) / float(core.group(2)):.1f}x the seed loop"
    print(line)
    print("   ", re.search(r"breakdown: .*", whole).group(0))
ray = (logs / "ray.log").read_text() if (logs / "ray.log").exists() else ""
for line in ray.splitlines():
    if line.startswith(("ray:", "  ", "RESULT")):
        print("(b)", line.strip())
    elif line.startswith("(b)"):
        print(line)
EOF

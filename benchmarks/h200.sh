#!/usr/bin/env bash
# The H200 figures behind docs/BENCHMARKS.md, docs/check/ and docs/hunt.md, in one device call
# (kind nvidia-h200, carrying .peers and .whl as scripts/device/peers.sh describes). Each step
# has its own time limit so that the whole stays inside one call; a step that runs out still
# leaves what it wrote under $OUT.
#   bash benchmarks/h200.sh            (from the repository root, on the device machine)
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=200
date -u +"%Y-%m-%dT%H:%MZ"; git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
source scripts/device/peers.sh
k() { python3 -m kdalab "$@"; }

# kdalab check: kdalab's kernel and both peers, with the contracts (docs/check/)
timeout "${CHECK_S:-250}" python3 -m kdalab check kdalab fla flashkda --device cuda --suite full \
    --isolate --case-timeout 120 --exclude 'fla=dims/*' --out /tmp/cr/check --quiet \
    > "$OUT/check.log" 2>&1; echo "check exit $?"; tail -n 3 "$OUT/check.log"
k check --redraw --out /tmp/cr/check --quiet; tar czf "$OUT/check.tar.gz" --exclude .lock -C /tmp/cr check

# kdalab hunt against each kernel (fla pinned to one shape: it autotunes every new one)
for t in kdalab fla flashkda; do
    extra=(--dims 64,128); [ "$t" = flashkda ] && extra=(--dims 128)
    [ "$t" = fla ] && extra=(--dims 128 --min-T 1024 --max-T 1024 --min-heads 4 --max-heads 4)
    timeout $(( ${HUNT_S:-70} + 40 )) python3 -m kdalab hunt "$t" --device cuda --seed 0 \
        --budget-s "${HUNT_S:-70}" "${extra[@]}" --out "/tmp/h/hunt-$t" --quiet \
        > "$OUT/hunt-$t.log" 2>&1; echo "hunt $t exit $?"; tail -n 3 "$OUT/hunt-$t.log"
done
tar czf "$OUT/hunts.tar.gz" --exclude "*.safetensors" -C /tmp/h .  # worst.json rebuilds each case

# the whole plain sweep command against the seed loop timed in the same run
timeout 120 python3 benchmarks/bench_sweep_whole.py whole --device cuda --accumulation h200 \
    --chunks 2-64 --seeds 0-499 --repeat 2 --seed-sample 4 --json "$OUT/sweep_whole.json" \
    2>&1 | grep -E "RESULT|kdalab sweep, run"

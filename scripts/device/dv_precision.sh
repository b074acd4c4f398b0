#!/usr/bin/env bash
# One-off (issue 40, dV's accuracy): the reverse pass's dU = dS'^T KEND^T with dS as two parts
# (autograd.BWD_MODE["exact_du"]: 0 truncated to tf32 as before, 1 the rest in tf32; dV = dU^T AINV in 3xTF32 with either), in one process: the backward's GPU time under
# each (bench_train --configs), then bench_train's accuracy rows (T 1024 H 16 against fp64)
# under 0 and 1.
set -uo pipefail
source scripts/device/peers.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/dvp}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/bench_train.py --no-speed \
    --shapes T4096_H16,T8192_H64,T1024_H16 \
    --configs 'block_v=128,bwd.exact_du=0;block_v=128,bwd.exact_du=1;block_v=128,bwd.exact_du=0' \
    --json "$OUT/speed.json" > "$OUT/speed.log" 2>&1
echo "speed exit $?"
for ex in 0 1; do
  timeout 125 python3 - "$ex" "$OUT/acc_$ex.json" > "$OUT/acc_$ex.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from kdalab.kernels import autograd
autograd.BWD_MODE["exact_du"] = int(sys.argv[1])
import bench_train
sys.argv = ["bench_train.py", "--no-speed", "--accuracy", "--json", sys.argv[2]]
bench_train.main()
PY
  echo "accuracy exact_du=$ex exit $?"
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
for path in [os.path.join(sys.argv[1], "speed.log")] + sorted(glob.glob(os.path.join(sys.argv[1], "acc_*.log"))):
    print("==", os.path.basename(path))
    for ln in open(path):
        if not ln.startswith("{"):
            continue
        r = json.loads(ln)
        if "family" in r:
            print(r["family"], r["gate"], " ".join(f"{n}={r.get('kdalab_d'+n, float('nan')):.3g}/{r.get('fla_d'+n, float('nan')):.3g}/{r.get('round_d'+n, float('nan')):.3g}" for n in ("q", "k", "v", "g", "beta", "A_log", "h0")))
        elif "config" in r:
            k = r.get("kernels", {})
            print(r["shape"], r["config"], "bwd", r.get("bwd_gpu_ms"), "dS pass", k.get("chunk_kda_bwd_recurrent_kernel"), "blocks", k.get("chunk_kda_bwd_blocks_kernel"), "vs first", r.get("grad_vs_first"), r.get("error", ""))
PY

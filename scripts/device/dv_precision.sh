#!/usr/bin/env bash
# One-off (issue 40, dv's accuracy): bench_train's accuracy rows (T 1024 H 16 against fp64) and
# the backward's time at two shapes, for the reverse pass's products as committed (A) and three
# variants made here by editing a copy of src/ (each in its own process):
#   B: dV = dU^T AINV in 3xTF32 (the blocks kernel);
#   C: B, and dS rounded to tf32 (nearest) before dU = dS'^T KEND^T in the dS pass;
#   D: B, and dU = dS'^T KEND^T in 3xTF32 in the dS pass.
set -uo pipefail
source scripts/device/peers.sh >/dev/null 2>&1
OUT=${OUT:-/tmp/dvp}; mkdir -p "$OUT"
F=kdalab/kernels/chunk_recurrent_bwd.py
mk() {  # variant name, sed expressions
  rm -rf "/tmp/v_$1"; cp -r src "/tmp/v_$1"; shift_name=$1; shift
  for e in "$@"; do sed -i "$e" "/tmp/v_$shift_name/$F"; done
}
DV='s/dvt = tl.dot(dut, ainv, input_precision="tf32")/dvt = tl.dot(dut, ainv, input_precision="tf32x3")/'
RND='s/dut = (_mm(dSt, kend_hi, DD) + _mm(dSt, klo, DD)/dSr = ((dSt.to(tl.int32, bitcast=True) + 4096) \& -8192).to(tl.float32, bitcast=True); dut = (_mm(dSr, kend_hi, DD) + _mm(dSr, klo, DD)/'
X3='s/dut = (_mm(dSt, kend_hi, DD) + _mm(dSt, klo, DD)/dut = (tl.dot(dSt, kend_hi, input_precision="tf32x3") + tl.dot(dSt, klo, input_precision="tf32x3")/'
cp -r src /tmp/v_A
mk B "$DV"; mk D "$DV" "$X3"  # C (emulated: the dA_log hunt case 0.145 against 0.060) not run
for v in A B D; do grep -c "tf32x3\|dSr" "/tmp/v_$v/$F"; done
for v in A B D; do
  PYTHONPATH=/tmp/v_$v:/tmp/site timeout 150 python3 benchmarks/bench_train.py --no-speed --accuracy \
      --shapes T4096_H16,T8192_H64 --configs 'block_v=128' --json "$OUT/acc_$v.json" \
      > "$OUT/acc_$v.log" 2>&1
  echo "variant $v exit $?"
  python3 - "$OUT/acc_$v.log" <<'PY'
import json, sys
for ln in open(sys.argv[1]):
    if not ln.startswith("{"):
        continue
    r = json.loads(ln)
    if "family" in r:
        print(r["family"], r["gate"], " ".join(f"{n}={r.get('kdalab_d'+n, float('nan')):.3g}/{r.get('fla_d'+n, float('nan')):.3g}/{r.get('round_d'+n, float('nan')):.3g}" for n in ("q", "k", "v", "g", "beta", "A_log", "h0")))
    elif "config" in r:
        k = r.get("kernels", {})
        print(r["shape"], "bwd", r.get("bwd_gpu_ms"), "dS pass", k.get("chunk_kda_bwd_recurrent_kernel"), "blocks", k.get("chunk_kda_bwd_blocks_kernel"), r.get("error", ""))
PY
done

#!/usr/bin/env bash
# Device calls of session 5 (kind nvidia-h200), on stage 1.
#   STAGE1_CALL=1 (nothing carried): stage 1 in blocks of key columns (fewer registers, more
#     programs an SM) against all columns at once: bench_kernel.py --explore (whole forward,
#     and stage 1 alone for each variant) at the shapes where stage 1 is most of the time,
#     then the accuracy table. Result: slower everywhere (docs/kernels.md); the variant is gone.
#   STAGE1_CALL=3 (carry .whl): every load first and every operand stored when formed, against
#     the previous kernel (a copy placed at kernels/_stage1_old.py for the call, not
#     committed): stage1_ab.py; the accuracy table; every GPU test.
#   STAGE1_CALL=4 (nothing carried): QG stored before K is normalized (182 registers against
#     231: 5 programs an SM against 4) against call 3's kernel (the copy at
#     kernels/_stage1_old.py): stage1_ab.py only.
# (Call 2 is stage1_profile.sh: Nsight Compute.)
set -o pipefail
export PYTHONUNBUFFERED=1 COLUMNS=200
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${STAGE1_CALL:-3}" = 1 ]; then
    timeout 330 python3 benchmarks/bench_kernel.py --explore \
        --shapes T8192_H64,B8_T4096_H32_state,varlen1024x8_H64,T1024_H16,T8192_H96,varlen6_H64 \
        --json "$OUT/explore.json" 2>&1 | grep -v '^{'
else
    timeout 200 python3 scripts/device/stage1_ab.py \
        T8192_H64,B8_T4096_H32_state,varlen1024x8_H64,varlen6_H64,T8192_H96,T1024_H16
fi
[ "${STAGE1_CALL:-3}" = 4 ] && exit 0
timeout 100 python3 benchmarks/bench_kernel.py --accuracy --json "$OUT/accuracy.json" 2>&1 \
    | grep -v skipped
[ "${STAGE1_CALL:-3}" = 1 ] || OUT=$OUT timeout 240 bash scripts/device/gpu_tests.sh 2>&1 | tail -n 15

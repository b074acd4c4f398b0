#!/usr/bin/env bash
# Last device call of session 2 (2026-11-29), run at commit 6b8f1a3 (config names as then:
# prep_w4 = 4-warp stage 1, t_fp16 = fp16 products): issue 3's GPU sweep benchmark (new draws),
# the new kernel GPU tests, and the kernel benchmark over stage-1 / stage-2 variants (speed at
# H = 64 and 96 fixed length, accuracy, stage split). Carry .whl (fla-core). Logs to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
timeout 100 python3 benchmarks/bench_gpu_sweep.py --profile --out $OUT 2>&1 \
    | grep -v "^ *\(aten\|void\|cuda\|cuLaunch\|Activity\|-----\|Name\|Self\)" | tee $OUT/bench_gpu_sweep.log
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "gpu_precision_variants or gpu_prefetch" 2>&1 | tee $OUT/pytest_kernels.log | tail -4
timeout 330 python3 benchmarks/bench_kernel.py --shapes 64f,96f \
    --configs default,t_bf16,t_fp16,prep_w4,prep_w16,inv_tf32x3,t_bf16_prep_w16 \
    --accuracy --accuracy-configs default,inv_tf32x3,t_bf16,t_fp16 \
    --stages --stage-configs default,t_fp16,prep_w4,prep_w16,inv_tf32x3 \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log

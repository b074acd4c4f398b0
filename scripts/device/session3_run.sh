#!/usr/bin/env bash
# Device call 2 of session 3 (2026-11-29 23:47 UTC), run at commit 7f2a1ef, where the
# bench's "default" was the tf32 configuration (now TF32_CONFIG), "fast" fp16 products with a
# 4-warp stage 1, "fast_w2" with a 2-warp one (now the default, less its range guard). Issue 6:
# the four shapes after the varlen chunk tables became cached per cu_seqlens, then the GPU kernel
# tests; issue 3: the GPU sweep benchmark with draws in processes. Carry .whl.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"
cat /sys/fs/cgroup/cpu.max 2>/dev/null
timeout 250 python3 benchmarks/bench_kernel.py --configs default,fast,fast_w2 \
    --accuracy --accuracy-configs default,fast_w2 \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k gpu 2>&1 \
    | tee $OUT/pytest_kernels.log | tail -4
timeout 190 python3 benchmarks/bench_gpu_sweep.py --profile --out $OUT 2>&1 \
    | grep -v "^ *\(aten\|void\|cuda\|cuLaunch\|Activity\|-----\|Name\|Self\)" | tee $OUT/bench_gpu_sweep.log

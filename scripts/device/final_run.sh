#!/usr/bin/env bash
# One device call for the last measurements of the session (2026-11-29): the Triton kernel's
# 64-token step (correctness on the GPU, speed at H = 64/96) and the seed experiment on CUDA
# against the CPU emulation. Expects the fla-core wheel in .whl (carried). Logs go to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version --format=csv
timeout 75 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gpu_step64 or gpu_long" \
    2>&1 | tee $OUT/kernel_pytest.log | tail -4
timeout 150 python3 benchmarks/bench_kernel.py --configs default,s64_t_bv64,s64_kv_bv64 \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_tensorcore.py -k "gpu" \
    2>&1 | tee $OUT/tc_pytest.log | tail -4
timeout 60 python3 scripts/device/compare_cuda_cpu.py $OUT 2>&1 | tee $OUT/compare.log
timeout 45 python3 benchmarks/bench_gpu_sweep.py --out $OUT 2>&1 | tee $OUT/bench_gpu.log

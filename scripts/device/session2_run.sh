#!/usr/bin/env bash
# One device call (session 2, 2026-11-29): issue 3's GPU sweep benchmark with its profile, every
# GPU test, the CUDA-vs-CPU comparison of the seed runs, then issue 6's kernel benchmark (three
# configurations, accuracy against fla, stage split; KERNEL_ARGS overrides). Carry .whl (fla-core). Logs go to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version --format=csv
nproc
timeout 170 python3 benchmarks/bench_gpu_sweep.py --profile --out $OUT 2>&1 | tee $OUT/bench_gpu_sweep.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tee $OUT/pytest_gpu.log | tail -6
timeout 60 python3 scripts/device/compare_cuda_cpu.py $OUT 2>&1 | tee $OUT/compare.log | tail -5
timeout ${KERNEL_TIMEOUT:-300} python3 benchmarks/bench_kernel.py ${KERNEL_ARGS:---configs default,t_bf16 --skip-speed --accuracy --stages} \
    --json $OUT/bench_kernel.json 2>&1 | tee $OUT/bench_kernel.log

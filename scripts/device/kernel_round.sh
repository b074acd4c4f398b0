#!/usr/bin/env bash
# Device run for issue 6, one call: GPU kernel tests, then the benchmark sweep with the stage
# split and accuracy against fla. Installs the carried fla wheel first. Logs to $OUT.
# usage (device tool, carry .whl): bash scripts/device/kernel_round.sh [bench args...]
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gpu" 2>&1 \
    | tee $OUT/pytest_kernels.log | tail -8
timeout ${BENCH_TIMEOUT:-330} python3 benchmarks/bench_kernel.py --json $OUT/bench_kernel.json "$@" 2>&1 \
    | tee $OUT/bench_kernel.log

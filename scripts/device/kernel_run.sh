#!/usr/bin/env bash
# Device run for issue 6 (Triton KDA forward): GPU tests, accuracy vs fla, benchmark.
# Expects PYTHONPATH with fla-core (carried wheel) and src/; writes logs to $OUT.
# usage: bash scripts/device/kernel_run.sh [bench args...]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gpu or bad or unsupported or needs" 2>&1 | tee $OUT/pytest.log | tail -15
timeout 165 python3 benchmarks/bench_kernel.py --json $OUT/bench.json "$@" 2>&1 | tee $OUT/bench.log

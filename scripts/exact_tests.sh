#!/usr/bin/env bash
# The tests marked `exact` (bits and golden data; pyproject.toml registers the marker) again on
# other CPU code paths, after the whole suite has run (the README's test command and .ci/run:
# `ruff check . && python -m pytest -q && bash scripts/exact_tests.sh`), so that an assertion that
# holds on one CPU only fails here before it fails on a user's:
#   MKL_CBWR=COMPATIBLE          MKL's compatible code path instead of the one it picks for this
#                                CPU (its BLAS and LAPACK sum in another order)
#   ATEN_CPU_CAPABILITY=default  ATen's generic kernels instead of this CPU's vector ones
#   ATEN_CPU_CAPABILITY=avx2     AVX2's vector width where the CPU has AVX-512's
#   1 or 2 threads               the intra-op split of reductions and products
# (The default capability draws float32 randn otherwise, so the tests that compare draws with
# stored digests skip there; the AVX2 run keeps them under MKL's compatible path.)
# Arguments go to every pytest call, e.g. `bash scripts/exact_tests.sh -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

exact() {  # the exact tests with the settings given as NAME=VALUE words
    local start=$SECONDS
    echo "== the exact tests under $*"
    env "$@" python -m pytest -q -m exact ${args[@]+"${args[@]}"}
    echo "== $((SECONDS - start)) s"
}
args=("$@")
exact MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
exact MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
exact MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

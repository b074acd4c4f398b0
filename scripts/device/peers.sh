# Source this from the repository root on the device machine (bash):  source scripts/device/peers.sh
#
# Puts the peers beside kdalab in this shell, for benchmarks, checks and golden data:
#   * the carried wheels in .whl/ (fla-core, and whatever else a call needs) -> /tmp/site;
#   * FlashKDA, built from the carried source tarball .peers/flashkda-*-src.tar.xz
#     (MIT; CUTLASS inside; nothing of it is committed), or taken from a carried build
#     .peers/flash_kda_build.tar.xz (the extension module a previous call built, left in $OUT,
#     with the flash_kda package beside it: then the source need not travel);
#     with PEERS_BUILD=background the build runs in the background: call peers_wait before
#     using flash_kda;
#   * PYTHONPATH = src (kdalab) : /tmp/site : FlashKDA's folder;  FLASHKDA_SRC = that folder
#     (its tests/torch_ref.py is FlashKDA's torch reference);
#   * fla's autotuning results cached on disk (FLA_CACHE_RESULTS=1) in $TRITON_CACHE_DIR, restored
#     from a carried .peers/triton_autotune.tar when there is one; `peers_save_autotune` writes
#     the results (not the compiled kernels) to $OUT for the next call.
# Prints one line per peer; a peer that fails to build is reported and left out (benchmarks
# report a missing peer as skipped).
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || echo "peers: wheel install failed"
fi
export PYTHONPATH=$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export FLA_CACHE_RESULTS=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .peers/triton_autotune.tar ]; then
    tar xf .peers/triton_autotune.tar -C "$TRITON_CACHE_DIR" && echo "peers: autotune cache restored"
fi
peers_save_autotune() {  # the autotuners' choices only (small), for the next call to carry
    (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar cf "$OUT/triton_autotune.tar" -T -) \
        && echo "peers: autotune cache -> \$OUT/triton_autotune.tar ($(tar tf "$OUT/triton_autotune.tar" | wc -l) files)"
}

export FLASHKDA_SRC=/tmp/flashkda-src/flashkda
mkdir -p "$FLASHKDA_SRC"
if [ ! -f "$FLASHKDA_SRC/setup.py" ] && ls .peers/flashkda-*-src.tar.xz >/dev/null 2>&1; then
    tar xf .peers/flashkda-*-src.tar.xz -C /tmp/flashkda-src
fi
for b in .peers/flash_kda_build.tar .peers/flash_kda_build.tar.xz; do
    [ -f "$b" ] && tar xf "$b" -C "$FLASHKDA_SRC"
done
export PYTHONPATH=$PYTHONPATH:$FLASHKDA_SRC

_peers_build() {
    local t0
    t0=$(date +%s)
    (cd "$FLASHKDA_SRC" && sed -i '/submodule/d' setup.py \
        && FLASH_KDA_CUDA_ARCHS=90a MAX_JOBS=16 NVCC_THREADS=16 \
           python3 setup.py build_ext --inplace >/tmp/flashkda-build.log 2>&1)
    if (cd /tmp && python3 -c "import flash_kda" 2>/dev/null); then
        echo "peers: FlashKDA built in $(( $(date +%s) - t0 )) s"
        if [ -n "${OUT:-}" ]; then  # xz: the module is 17 MB, a returned file at most 16 MiB
            (cd "$FLASHKDA_SRC" && tar cf - flash_kda_C*.so flash_kda | xz -T0 -6 > "$OUT/flash_kda_build.tar.xz") \
                && echo "peers: build -> \$OUT/flash_kda_build.tar.xz ($(du -h "$OUT/flash_kda_build.tar.xz" | cut -f1))"
        fi
    else
        echo "peers: FlashKDA build FAILED (skipped); last lines of /tmp/flashkda-build.log:"
        tail -n 15 /tmp/flashkda-build.log
    fi
}
PEERS_BUILD_PID=
if (cd /tmp && python3 -c "import flash_kda" 2>/dev/null); then
    echo "peers: flash_kda importable (carried build)"
elif [ ! -f "$FLASHKDA_SRC/setup.py" ]; then
    echo "peers: FlashKDA neither carried built nor as source (skipped)"
elif [ "${PEERS_BUILD:-}" = background ]; then
    _peers_build &
    PEERS_BUILD_PID=$!
    echo "peers: FlashKDA building in the background (pid $PEERS_BUILD_PID)"
else
    _peers_build
fi
# polls rather than waits: a subshell (h200.sh's steps) cannot wait for its parent's child
peers_wait() {
    while [ -n "$PEERS_BUILD_PID" ] && kill -0 "$PEERS_BUILD_PID" 2>/dev/null; do sleep 1; done
    return 0
}
python3 -c "import fla; print('peers: fla', fla.__version__)" 2>/dev/null || echo "peers: fla missing"

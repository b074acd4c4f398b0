#!/usr/bin/env bash
# The H200 figures behind docs/BENCHMARKS.md, docs/check/ and docs/hunt.md, as steps that fit in
# device calls of at most 10 minutes (kind nvidia-h200, carrying .peers, .whl and .runs as
# scripts/device/peers.sh describes):
#   KDALAB_COMMIT=<sha> bash benchmarks/h200.sh STEP...   (from the repository root, there)
# Steps:
#   check     kdalab check kdalab fla flashkda (CHECK_KERNELS), full suite, contracts
#             (docs/check/); continues the run carried in .runs/check (--resume) when there is one;
#             CHECK_CASES: some cases only (--cases), e.g. 'unbounded/*,strong_decay/*,log_decay/*'
#   hunt      kdalab hunt kdalab for HUNT_S seconds; continues the hunt carried in
#             .runs/hunt-kdalab (--resume) when there is one (the 10-minute hunt is two calls)
#   hunts     kdalab hunt against fla and FlashKDA, PEER_HUNT_S seconds each
#   check-grad kdalab check kdalab fla --grad (CHECK_GRAD_KERNELS, CHECK_GRAD_SUITE: default
#             quick), the gradient
#             table (docs/check-grad/); continues .runs/check-grad (--resume) when carried
#   hunt-grad kdalab hunt kdalab --grad for HUNT_S seconds; continues .runs/hunt-grad (--resume);
#             HUNT_BWD: BWD_MODE keys set for it (a candidate, e.g. dkend_over_du=0); HUNT_TARGET:
#             another kernel to hunt (e.g. kdalab-fp32)
#   replay    scripts/replay_hunt.py on the GPU: a hunt's worst trials (REPLAY_HUNT, a folder; its
#             trials.jsonl may be gzipped) measured again on REPLAY_TARGETS (default
#             kdalab,kdalab-fp32), REPLAY_TOP of them (default 12)
#   fla-causal the causal contracts of the quick suite on fla (T = 128 and 134)
#   cublas    cuBLAS's fp16 GEMM against kdalab's summation-order candidates (tensor-cores.md)
#   gpu-tests every GPU test of the suite (scripts/device/gpu_tests.sh; TESTS_S, default 540: 64
#             tests ran past 420 s at aa848c3); TESTS_K: a -k selection, e.g. kernels_backward
#             (the backward's 8, 175 s on an H100; '-k backward' also takes check --grad's fla
#             case, whose autotuning ran past 200 s at 5784e74). The whole suite takes three
#             calls on a fresh machine: TESTS_K='not kernels_backward and not check_grad' (85
#             tests), then kernels_backward (8: 375 s of them on a fresh H100 at e0f434b, its
#             first test 206 s of compiles), then check_grad (fla's autotuning); at e0f434b the
#             first two in one plain `timeout 575` call (TERM: no JUnit file) were cut off
#   serving   benchmarks/bench_decode.py: decode, pool, checkpoints, many short sequences
#             (SERVING_PARTS: some of decode,pool,short; SERVING_ARGS: more options, e.g.
#             "--candidates default,guard_inline --rounds 3")
#   grid      benchmarks/bench_kernel.py: the issue-11 prefill grid against the peers (GRID_ALT:
#             also a candidate KernelConfig, e.g. fp16_guard=launch; GRID_SHAPES: some shapes;
#             GRID_BASELINE=.baseline: also an earlier commit's kernels, as the baseline step)
#   ws-sanitize the Gluon stage 2's few-chunk GPU tests (tests/test_kernels_ws.py) under
#             compute-sanitizer (memcheck, then racecheck: the TMA ring's and the stores' shared
#             memory between the warps; Firecracker only), without torch's caching allocator;
#             WS_SAN_FILE, WS_SAN_K, WS_SAN_TOOLS: other tests (e.g. tests/test_kernels_bwd_ws.py,
#             'gpu_blocks_ws and serial', memcheck)
#   ncu       one training step's backward kernels under Nsight Compute (benchmarks/ncu_bwd.py;
#             NCU_SHAPE, NCU_BWD: a BWD_MODE candidate; Firecracker only): the details text and
#             the source CSV, for benchmarks/ncu_summary.py's page
#   explore   benchmarks/bench_kernel.py --explore: the whole call under each launch choice
#             (bench_kernel.explore_configs, with the Gluon stage 2), stage 1 alone, the passes
#             (GRID_SHAPES: some shapes; EXPLORE_S, default 300)
#   baseline  benchmarks/bench_kernel.py --grid --no-peers --baseline .baseline: kdalab against
#             an earlier commit's kernels in alternating rounds (build them here with
#             scripts/baseline_kernels.sh COMMIT and carry .baseline; GRID_SHAPES: some shapes)
#   sweep     the whole sweep command against the seed loop (bench_sweep_whole.py)
#   gates     benchmarks/bench_gates.py: the gate modes' prices on the grid and fla on unbounded
#             inputs (GATES_ARGS: its options, e.g. "--fla-shapes T1024_H16 --rounds 2")
#   train     benchmarks/bench_train.py: forward+backward against fla, memory, gradient
#             accuracy (TRAIN_ARGS: its options, e.g. "--shapes T8192_H64 --accuracy")
# fla autotunes every new shape (30-90 s; the whole grid's ten take longer than one call):
# the grid step leaves fla's choices in $OUT/triton_autotune.tar, carried as .peers/ next time
# (those of the calls up to 893d278: the train shapes T 1024-8192 at H 16 and 64, two varlen
# ones and B 8 T 4096 H 32, the backward GPU tests' and the check gate groups' shapes:
# `git show b02c897:scripts/device/data/fla_autotune_h200.tar > .peers/triton_autotune.tar`).
# PEERS_BUILD=background builds FlashKDA (when its source is carried) while fla warms up; the
# grid waits for it, and the build comes back as $OUT/flash_kda_build.tar.xz to carry next time.
# A bare device has no fla: carry its wheel in .whl/ (`pip download --no-deps fla-core==0.6.0
# -d .whl` here), and FlashKDA's source tarball in .peers/ (../shared/peers/). Nor has it
# optuna, which the hunt steps need (`pip download optuna -d .whl`, its dependencies too: at
# 0d3e4cf a hunt-grad step without it stopped at its import, ModuleNotFoundError).
# `a+b` runs steps a and b side by side (for steps that are not timed: check, hunt, cublas,
# gpu-tests). Each step has its own time limit and writes under /tmp/kd/<step>; after each step everything
# is packed into $OUT/h200.tar.gz (one file back, whatever stops the call), and its last lines
# are printed. Unpack it into .runs/ here to carry the check and the hunt into the next call.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=200
# KDALAB_COMMIT: the commit sent (the device's copy of .git is not the checkout's); the check's
# report records it
date -u +"%Y-%m-%dT%H:%MZ"; nvidia-smi --query-gpu=name --format=csv,noheader
echo "commit ${KDALAB_COMMIT:=unknown}"; export KDALAB_COMMIT
source scripts/device/peers.sh
R=/tmp/kd
mkdir -p "$R"
k() { timeout -s INT -k 30 "$1" python3 -m kdalab "${@:2}"; }  # INT: the CLI stops cleanly

step_check() {
    local resume=() kernels=(${CHECK_KERNELS:-kdalab fla flashkda}) ex=()
    if [ -d .runs/check ]; then cp -r .runs/check "$D/check"; resume=(--resume); fi
    # fla's dims cases are excluded only where the run has them: --exclude refuses a pattern
    # that matches no case (with CHECK_CASES 'unbounded/*' it stopped the step at ee18cb7)
    if [ -n "${CHECK_CASES:-}" ]; then ex=(--cases "$CHECK_CASES")
    elif [[ " ${kernels[*]} " == *" fla "* ]]; then ex=(--exclude 'fla=dims/*'); fi
    k "${CHECK_S:-500}" check "${kernels[@]}" --device cuda --suite full --isolate \
        --case-timeout 120 "${ex[@]}" --out "$D/check" --quiet "${resume[@]}" \
        > "$D/check.log" 2>&1
    echo "check exit $?"
    k 120 check --redraw --out "$D/check" --quiet >> "$D/check.log" 2>&1
    grep -E "PASS|FAIL" "$D/check/report.md" | head -n 3
}

step_hunt() {
    local resume=()
    if [ -d .runs/hunt-kdalab ]; then cp -r .runs/hunt-kdalab "$D/hunt-kdalab"; resume=(--resume); fi
    k $(( ${HUNT_S:-290} + 60 )) hunt kdalab --device cuda --seed 0 --budget-s "${HUNT_S:-290}" \
        --dims 64,128 --out "$D/hunt-kdalab" --quiet "${resume[@]}" > "$D/hunt-kdalab.log" 2>&1
    echo "hunt kdalab exit $?"; tail -n 3 "$D/hunt-kdalab.log"
}

step_check-grad() {
    local resume=()
    if [ -d .runs/check-grad ]; then cp -r .runs/check-grad "$D/check-grad"; resume=(--resume); fi
    k "${CHECK_S:-500}" check ${CHECK_GRAD_KERNELS:-kdalab fla} --grad --device cuda \
        --suite "${CHECK_GRAD_SUITE:-quick}" \
        --isolate --case-timeout 200 ${CHECK_GRAD_ARGS:-} --out "$D/check-grad" --quiet "${resume[@]}" \
        > "$D/check-grad.log" 2>&1
    echo "check --grad exit $?"
    k 120 check --redraw --out "$D/check-grad" --quiet >> "$D/check-grad.log" 2>&1
    grep -E "PASS|FAIL" "$D/check-grad/report.md" | head -n 3; tail -n 5 "$D/check-grad.log"
    peers_save_autotune
}

step_hunt-grad() {
    local resume=()
    if [ -d .runs/hunt-grad ]; then cp -r .runs/hunt-grad "$D/hunt-grad"; resume=(--resume); fi
    # HUNT_BWD: autograd.BWD_MODE keys set for the hunt (KEY=INT,...), e.g. dkend_over_du=0;
    # the CLI has no such option. A key BWD_MODE lacks stops the step. The folder is still
    # hunt-grad: rename it hunt-grad@VARIANT here for collect_h200's row to name the candidate
    local pre="import runpy, sys; from kdalab.kernels import autograd as a
try: a.BWD_MODE.update(a.bwd_mode_settings(sys.argv.pop(1)))
except ValueError as e: sys.exit(f'HUNT_BWD: {e}')
print('BWD_MODE', a.BWD_MODE, flush=True); sys.argv[0] = 'kdalab'
runpy.run_module('kdalab', run_name='__main__')"
    echo "hunt-grad BWD_MODE changes: ${HUNT_BWD:-none}" > "$D/hunt-grad.log"
    timeout -s INT -k 30 $(( ${HUNT_S:-290} + 60 )) python3 -c "$pre" "${HUNT_BWD:-}" \
        hunt "${HUNT_TARGET:-kdalab}" --grad --device cuda --seed 0 \
        --budget-s "${HUNT_S:-290}" --dims 64,128 --out "$D/hunt-grad" --quiet "${resume[@]}" \
        >> "$D/hunt-grad.log" 2>&1
    echo "hunt --grad exit $?"; tail -n 3 "$D/hunt-grad.log"
}

step_replay() {
    local src=${REPLAY_HUNT:?REPLAY_HUNT: a hunt folder}
    mkdir -p "$D/hunt"; cp "$src"/hunt.json "$D/hunt/"
    if [ -f "$src/trials.jsonl.gz" ]; then gunzip -c "$src/trials.jsonl.gz" > "$D/hunt/trials.jsonl"
    else cp "$src/trials.jsonl" "$D/hunt/"; fi
    timeout "${REPLAY_S:-300}" python3 scripts/replay_hunt.py "$D/hunt" --device cuda \
        --targets "${REPLAY_TARGETS:-kdalab,kdalab-fp32}" --top "${REPLAY_TOP:-12}" \
        --json "$D/replay.jsonl" > "$D/replay.log" 2>&1
    echo "replay exit $?"; tail -n 20 "$D/replay.log"; rm -f "$D/hunt/trials.jsonl"
}

step_hunts() {  # fla pinned to one shape: it autotunes every new one
    local t extra
    for t in fla flashkda; do
        extra=(--dims 128)
        [ "$t" = fla ] && extra=(--dims 128 --min-T 1024 --max-T 1024 --min-heads 4 --max-heads 4)
        k $(( ${PEER_HUNT_S:-70} + 40 )) hunt "$t" --device cuda --seed 0 \
            --budget-s "${PEER_HUNT_S:-70}" "${extra[@]}" --out "$D/hunt-$t" --quiet \
            > "$D/hunt-$t.log" 2>&1
        echo "hunt $t exit $?"; tail -n 3 "$D/hunt-$t.log"
    done
}

step_cublas() {
    timeout 120 python3 benchmarks/cublas_shapes.py --json "$D/cublas_shapes.json" \
        --raw "$D/cublas_shapes.npz" 2>&1 | tee "$D/cublas.log" | tail -n 40
}

step_fla-causal() {
    k 200 check fla --device cuda --suite quick --cases 'contract/causal/*' --out "$D/check" \
        --quiet > "$D/check.log" 2>&1
    echo "fla causal exit $?"; grep -E "causal" "$D/check/report.md" | head -n 4
}

step_gpu-tests() {
    # INT at the limit: pytest stops as on ^C and still writes the JUnit file of the tests
    # that ran; fla's tunings (its backward autotunes 200 s and more a new test shape) go
    # back even then, for the next call to carry
    OUT=$D timeout -s INT -k 30 "${TESTS_S:-540}" bash scripts/device/gpu_tests.sh \
        ${TESTS_K:+-k "$TESTS_K"} > "$D/gpu_tests.log" 2>&1
    echo "gpu tests exit $?"; tail -n 25 "$D/gpu_tests.log"
    peers_save_autotune
}

step_serving() {
    timeout "${SERVING_S:-300}" python3 benchmarks/bench_decode.py --json "$D/decode.json" \
        --parts "${SERVING_PARTS:-decode,pool,short}" ${SERVING_ARGS:-} > "$D/serving.log" 2>&1
    echo "serving exit $?"; grep -E "RESULT|x " "$D/serving.log" | tail -n 40
}

step_grid() {
    local shapes=(${GRID_SHAPES:+--shapes "$GRID_SHAPES"})
    timeout 150 python3 benchmarks/bench_kernel.py --warm-peers "${shapes[@]}" > "$D/grid.log" 2>&1
    peers_wait  # a FlashKDA build started in the background (PEERS_BUILD=background) ends first
    timeout "${GRID_S:-300}" python3 benchmarks/bench_kernel.py --grid --json "$D/grid.json" \
        "${shapes[@]}" ${GRID_ALT:+--alt "$GRID_ALT"} ${GRID_BASELINE:+--baseline "$GRID_BASELINE"} \
        >> "$D/grid.log" 2>&1
    echo "grid exit $?"; tail -n 30 "$D/grid.log"
    peers_save_autotune  # fla's choices (30-90 s a new shape) for the next call to carry
}

step_ws-sanitize() {
    local t
    # each tensor its own allocation (no caching allocator): memcheck then sees a read outside
    # a tensor, which inside the allocator's segment would land in a neighbour unseen
    for t in ${WS_SAN_TOOLS:-memcheck racecheck}; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${WS_SAN_S:-150}" \
            /usr/local/cuda/bin/compute-sanitizer --tool "$t" \
            --print-limit 20 python3 -m pytest -q -p no:cacheprovider -m gpu \
            "${WS_SAN_FILE:-tests/test_kernels_ws.py}" -k "${WS_SAN_K:-few_chunks}" \
            > "$D/ws_sanitize_$t.log" 2>&1
        echo "ws-sanitize $t exit $?"; tail -n 12 "$D/ws_sanitize_$t.log"
    done
}

step_ncu() {  # one training step's backward kernels under Nsight Compute (Firecracker only)
    # the first step's launches: the dS pass's two passes where it splits, the blocks kernel,
    # stage 1's backward (-c 3 at T4096_H16 stopped before it); the clocks left alone
    local kernels='regex:chunk_kda_prepare_bwd_kernel|chunk_kda_bwd_blocks_ws_kernel|chunk_kda_bwd_recurrent_ws_kernel'
    timeout "${NCU_S:-300}" ncu --clock-control none -k "$kernels" -c 4 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
        -f -o "$D/ncu_bwd" python3 benchmarks/ncu_bwd.py --shape "${NCU_SHAPE:-T4096_H16}" \
        --steps 1 ${NCU_BWD:+--bwd "$NCU_BWD"} > "$D/ncu_bwd.log" 2>&1
    echo "ncu exit $?"; tail -n 5 "$D/ncu_bwd.log"
    ncu -i "$D/ncu_bwd.ncu-rep" --page details > "$D/ncu_bwd.txt" 2>&1
    ncu -i "$D/ncu_bwd.ncu-rep" --page source --csv --print-source sass 2>/dev/null \
        | gzip -9 > "$D/ncu_bwd_sass.csv.gz"
    rm -f "$D/ncu_bwd.ncu-rep"  # 5 MB; the two texts are what ncu_summary.py reads
    grep -E "^  [a-z_]+_kernel|Duration|Issue Slots Busy|Achieved Occupancy" "$D/ncu_bwd.txt"
}

step_explore() {
    local shapes=(${GRID_SHAPES:+--shapes "$GRID_SHAPES"})
    timeout "${EXPLORE_S:-300}" python3 benchmarks/bench_kernel.py --explore \
        --json "$D/explore.json" "${shapes[@]}" > "$D/explore.log" 2>&1
    echo "explore exit $?"; tail -n 40 "$D/explore.log"
}

step_baseline() {
    local shapes=(${GRID_SHAPES:+--shapes "$GRID_SHAPES"})
    timeout "${BASELINE_S:-240}" python3 benchmarks/bench_kernel.py --grid --no-peers \
        --baseline .baseline --json "$D/baseline.json" "${shapes[@]}" > "$D/baseline.log" 2>&1
    echo "baseline exit $?"; tail -n 14 "$D/baseline.log"
}

step_gates() {
    timeout "${GATES_S:-300}" python3 benchmarks/bench_gates.py --json "$D/gates.json" \
        ${GATES_ARGS:-} > "$D/gates.log" 2>&1
    echo "gates exit $?"; tail -n 16 "$D/gates.log"
    peers_save_autotune
}

step_train() {
    timeout "${TRAIN_S:-400}" python3 benchmarks/bench_train.py --json "$D/train.json" \
        ${TRAIN_ARGS:-} > "$D/train.log" 2>&1
    echo "train exit $?"; tail -n 40 "$D/train.log"
    peers_save_autotune
}

step_sweep() {  # the plain command against the start-up candidates, interleaved
    timeout "${SWEEP_S:-240}" python3 benchmarks/bench_sweep_whole.py whole --device cuda \
        --accumulation h200 --chunks 2-64 --seeds 0-499 --rounds "${SWEEP_ROUNDS:-3}" \
        --variants "${SWEEP_VARIANTS:-plain}" \
        --json "$D/sweep_ab_h200.json" > "$D/sweep.log" 2>&1
    echo "sweep exit $?"; grep -E "RESULT|round|variant|x the seed" "$D/sweep.log" | tail -n 30
}

for group in "$@"; do  # a+b: steps a and b side by side (neither is timed)
    IFS=+ read -ra steps <<< "$group"
    for s in "${steps[@]}"; do
        echo "== $s  $(date -u +%H:%M:%S)"
        # a warm machine keeps /tmp/kd from the previous call: a step starts from an empty
        # folder, so that a step cut short never returns an earlier call's JSON as its own
        ( D=$R/$s; rm -rf "$D"; mkdir -p "$D"; "step_$s" > "$R/$s.out" 2>&1
          tar czf "$OUT/$s.tar.gz" --exclude .lock --exclude '*.safetensors' -C "$R" "$s" ) &
    done
    wait
    for s in "${steps[@]}"; do cat "$R/$s.out"; done
done
peers_wait  # a background build's result lands in $OUT before the call ends
echo "== done  $(date -u +%H:%M:%S)"

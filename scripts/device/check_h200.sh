#!/usr/bin/env bash
# kdalab check, the full suite on the H200, for the README's report card (docs/check/):
#   kdalab, kdalab-tf32, fla, fla-recurrent and flashkda (when it builds), each kernel in its
#   own process (--isolate: a kernel that faults the GPU is recorded as crashed, the others
#   still run), fla excluded from the three dims/* cases (each (K, V) pair is a new shape that
#   fla autotunes for 30-90 s; it runs every K = V = 128 case, fixed and varlen).
# Run from the repository root (carry .whl and .peers); then, on the workstation:
#   tar xzf <files_at>/check.tar.gz -C docs/      # -> docs/check/report.{html,md}, errors.png, records
# Outputs in $OUT: check.tar.gz, check.log, and peers.sh's flash_kda_build.tar /
# triton_autotune.tar (carry them next time: no FlashKDA build, no fla autotuning).
# Exit code: kdalab check's (0 all pass, 1 some case fails, 2 usage error).
# Tried on a CPU with: CHECK_PEERS=0 CHECK_DEVICE=cpu CHECK_SUITE=quick \
#   CHECK_KERNELS="recipe:flashkda recipe:fla" OUT=/tmp/out bash scripts/device/check_h200.sh
set -o pipefail
if [ "${CHECK_PEERS:-1}" = 1 ]; then
    source scripts/device/peers.sh
else
    peers_save_autotune() { :; }
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export COLUMNS=200  # the terminal table in check.log unwrapped

if [ -n "${CHECK_KERNELS:-}" ]; then
    read -r -a kernels <<< "$CHECK_KERNELS"
    exclude=()
else
    kernels=(kdalab kdalab-tf32 fla fla-recurrent)
    if (cd /tmp && python3 -c "import flash_kda") 2>/dev/null; then
        kernels+=(flashkda)
    else
        echo "check: flash_kda is not importable here: flashkda left out of the report"
    fi
    exclude=(--exclude 'fla=dims/*')
fi
kdalab=(python3 -c "from kdalab.cli import main; main()")
dest=/tmp/check-report/check
rm -rf "$dest"
t0=$SECONDS
# what is left of the call's 600 s once peers.sh is done, less 20 s to pack; a kernel that
# finishes no case in 150 s (fla autotunes a new shape for 30-90 s) is killed and recorded
timeout $(( ${CHECK_BUDGET:-580} - SECONDS )) "${kdalab[@]}" check "${kernels[@]}" \
    --device "${CHECK_DEVICE:-cuda}" --suite "${CHECK_SUITE:-full}" --isolate \
    --case-timeout 150 "${exclude[@]}" --out "$dest" 2>&1 | tee "$OUT/check.log"
rc=${PIPESTATUS[0]}
echo "check: exit code $rc after $(( SECONDS - t0 )) s"
if [ "$rc" = 124 ]; then  # out of time: the report from the records written so far
    "${kdalab[@]}" check --redraw --out "$dest" --quiet
fi
tar czf "$OUT/check.tar.gz" -C /tmp/check-report check && echo "check: report -> \$OUT/check.tar.gz"
peers_save_autotune
exit "$rc"

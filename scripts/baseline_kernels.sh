#!/usr/bin/env bash
# An earlier commit's kdalab.kernels as the package kdalab_baseline in DEST (default .baseline),
# for `bench_kernel.py --grid --baseline DEST`: the old kernel timed against the new one in one
# process (issue 41's guard against the kernel before it). Its custom ops are renamed to
# kdalab_baseline::*, so both register. Run here (the device's .git has no history) and carry
# DEST:   bash scripts/baseline_kernels.sh fac9f3d
set -euo pipefail
commit=${1:?usage: baseline_kernels.sh COMMIT [DEST]}
dest=${2:-.baseline}
pkg=$dest/kdalab_baseline
rm -rf "$pkg"
mkdir -p "$pkg"
git archive "$commit" src/kdalab/kernels | tar x --strip-components=3 -C "$pkg"
grep -rl '"kdalab::' "$pkg" | xargs -r sed -i 's/"kdalab::/"kdalab_baseline::/g'
# and the calls by attribute (the autograd's torch.ops.kdalab.chunk_kda): left as they were,
# the baseline's training step ran the new op (bench_train --baseline at 7c4f5db: void)
grep -rl 'torch\.ops\.kdalab\.' "$pkg" | xargs -r sed -i 's/torch\.ops\.kdalab\./torch.ops.kdalab_baseline./g'
if grep -rn 'ops\.kdalab\.\|"kdalab::' "$pkg"; then
    echo "baseline_kernels.sh: $commit's kernels still name kdalab's ops" >&2
    exit 1
fi
if grep -rnE '^\s*(from|import) kdalab\b' "$pkg"; then
    echo "baseline_kernels.sh: $commit's kernels import the rest of kdalab; not standalone" >&2
    exit 1
fi
git rev-parse --short "$commit" > "$pkg/COMMIT"
echo "$pkg: kdalab.kernels at $(cat "$pkg/COMMIT")"

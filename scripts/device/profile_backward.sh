#!/usr/bin/env bash
# One-off (issue 40): Nsight Compute on the backward's kernels (and stage 1 and the serial pass
# of the forward) of one training step, in a device call:
#   PROFILE_SHAPES="T4096_H16 T8192_H64" bash scripts/device/profile_backward.sh
# Writes $OUT/ncu_<shape>_<kernel>.txt (the sections below, as ncu prints them).
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/prof}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -n 1)
python3 scripts/device/profile_backward.py --shape T4096_H16 --steps 1  # compiles, warms
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
          --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters)
for shape in ${PROFILE_SHAPES:-T4096_H16}; do
  for kern in chunk_kda_prepare_bwd_kernel chunk_kda_bwd_blocks_kernel \
              chunk_kda_bwd_recurrent_kernel chunk_kda_prepare_kernel \
              chunk_kda_recurrent_kernel; do
    timeout 240 "$NCU" --clock-control none -k "regex:^${kern}$" -s 1 -c 1 "${sections[@]}" \
        python3 scripts/device/profile_backward.py --shape "$shape" --steps 2 \
        > "$OUT/ncu_${shape}_${kern}.txt" 2>&1
    echo "$shape $kern exit $?"
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc A|Memory Throughput|DRAM Throughput|Compute \(SM\)|No Eligible|Local" \
        "$OUT/ncu_${shape}_${kern}.txt" | head -n 16
  done
done

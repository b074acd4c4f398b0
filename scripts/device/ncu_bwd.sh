#!/usr/bin/env bash
# Nsight Compute on the training step's backward kernels (device machine, repository root;
# Firecracker runtimes only: docs of the device tool, H200.md): warp stall reasons, issue
# rate, occupancy and memory throughput of stage 1's backward, the blocks kernel and the dS
# pass at one shape, as text in $OUT/ncu_bwd.txt (and the report, $OUT/ncu_bwd.ncu-rep).
#   NCU_SHAPE=T4096_H16 NCU_BWD='' bash scripts/device/ncu_bwd.sh
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp}
kernels='regex:chunk_kda_prepare_bwd_kernel|chunk_kda_bwd_blocks_ws_kernel|chunk_kda_bwd_recurrent_ws_kernel'
# the first step's launches (the same kernels as later ones): the dS pass's two passes where it
# splits, the blocks kernel, stage 1's backward (-c 3 at T4096_H16 stopped before it); the
# clocks left alone
timeout "${NCU_S:-300}" ncu --clock-control none -k "$kernels" -c 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section InstructionStats --section SourceCounters \
    -f -o "$OUT/ncu_bwd" python3 benchmarks/ncu_bwd.py --shape "${NCU_SHAPE:-T4096_H16}" \
    --steps 1 ${NCU_BWD:+--bwd "$NCU_BWD"} > "$OUT/ncu_bwd.log" 2>&1
echo "ncu exit $?"; tail -n 5 "$OUT/ncu_bwd.log"
ncu -i "$OUT/ncu_bwd.ncu-rep" --page details > "$OUT/ncu_bwd.txt" 2>&1
ncu -i "$OUT/ncu_bwd.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_bwd_sass.csv" 2>/dev/null \
    || echo "no source page"
grep -E "^  [a-z_]+_kernel|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Stall" "$OUT/ncu_bwd.txt" | head -n 80

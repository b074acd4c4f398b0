#!/usr/bin/env bash
# Device call 2 of session 5 (kind nvidia-h200, nothing carried): Nsight Compute on stage 1
# (all 128 key columns, 2 warps) and the recurrent pass at varlen 1024 x 8, H = 64 and
# B = 8, T = 4096, H = 32 (the two grid shapes where kdalab trails FlashKDA): where the time
# goes — throughput, occupancy, stall reasons, the SASS lines that stall most.
export PYTHONUNBUFFERED=1 COLUMNS=200
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
for shape in varlen1024x8_H64 B8_T4096_H32_state; do
    timeout 200 "$NCU" --clock-control none --profile-from-start off \
        -k regex:'chunk_kda_(prepare|recurrent)_kernel' -c 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters \
        -o "/tmp/prof_$shape" python3 scripts/device/stage1_profile.py "$shape" 2>&1 | tail -n 3
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page details > "$OUT/ncu_$shape.txt" 2>&1
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page source --csv --print-source sass \
        > "/tmp/src_$shape.csv" 2>&1 && gzip -c "/tmp/src_$shape.csv" > "$OUT/src_$shape.csv.gz"
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|No Eligible|Block Limit" \
        "$OUT/ncu_$shape.txt" | head -n 40
done

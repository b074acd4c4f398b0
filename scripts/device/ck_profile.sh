#!/usr/bin/env bash
# One device call (kind nvidia-h200, nothing carried): where the checkpoints' cost goes.
# Call 1 (36a6ecd): timings (eager and graph replay; checkpoints every 64/128/256 tokens, fp32
# and bf16), then Nsight Compute on the recurrent kernel of a pool call and a call with
# checkpoints. Call 2: the checkpoint stored after the next chunk's loads are issued
# (chunk_recurrent.CHECKPOINT_AFTER_LOADS) against before, same bits, 3 interleaved rounds.
export PYTHONUNBUFFERED=1 COLUMNS=200
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
date -u +"%Y-%m-%dT%H:%MZ"; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 scripts/device/ck_profile.py T1024_H16 varlen1024x8_H64 B8_T4096_H32_state \
    T131072_H8 2>&1 | tee "$OUT/ck_timings.jsonl" | cut -c1-3000
[ -n "${CK_NCU:-}" ] || exit 0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
for shape in B8_T4096_H32_state T1024_H16; do
    timeout 150 "$NCU" --clock-control none --profile-from-start off \
        -k regex:'chunk_kda_recurrent_kernel' \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section SourceCounters \
        -o "/tmp/prof_$shape" python3 scripts/device/ck_profile.py profile "$shape" 2>&1 | tail -n 3
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page details > "$OUT/ncu_$shape.txt" 2>&1
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page source --csv --print-source sass \
        > "/tmp/src_$shape.csv" 2>&1 && gzip -c "/tmp/src_$shape.csv" > "$OUT/src_$shape.csv.gz"
    grep -E "chunk_kda_recurrent|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Dynamic Shared|Block Limit Sh" \
        "$OUT/ncu_$shape.txt" | head -n 60
done

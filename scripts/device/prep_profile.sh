#!/usr/bin/env bash
# One device call (kind nvidia-h200, carrying .peers and .whl): stage 1 on many short
# sequences — launch variants timed (prep_profile.py), FlashKDA's kernels one by one, then
# (PREP_NCU=1) Nsight Compute on one stage-1 launch; (PREP_SHORT=1) the serving benchmark's
# many-short part against the peers.
export PYTHONUNBUFFERED=1 COLUMNS=200
date -u +"%Y-%m-%dT%H:%MZ"; nvidia-smi --query-gpu=name --format=csv,noheader
source scripts/device/peers.sh
timeout 240 python3 scripts/device/prep_profile.py ${PREP_SHAPES:-varlen1024x8_H64 varlen37_H32 \
    B128_T64_H16 B8_T4096_H32_state} 2>&1 | tee "$OUT/prep_timings.jsonl" | cut -c1-3000
if [ -n "${PREP_FLASHKDA:-}" ]; then
    timeout 90 python3 scripts/device/prep_profile.py flashkda varlen1024x8_H64 \
        2>&1 | tee "$OUT/kernels.jsonl" | cut -c1-3000
fi
if [ -n "${PREP_SHORT:-}" ]; then
    timeout 240 python3 benchmarks/bench_decode.py --json "$OUT/decode.json" --parts short \
        --candidates default,s1_r168 --rounds 3 > "$OUT/serving.log" 2>&1
    echo "serving exit $?"; grep -E "RESULT|x " "$OUT/serving.log" | tail -n 20
fi
[ -n "${PREP_NCU:-}" ] || exit 0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
for shape in ${PREP_NCU_SHAPES:-varlen1024x8_H64}; do
    timeout 150 "$NCU" --clock-control none --profile-from-start off \
        -k regex:'chunk_kda_prepare_kernel' \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section SourceCounters --section InstructionStats --section ComputeWorkloadAnalysis \
        -o "/tmp/prof_$shape" python3 scripts/device/prep_profile.py profile "$shape" 2>&1 | tail -n 3
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page details > "$OUT/ncu_$shape.txt" 2>&1
    "$NCU" -i "/tmp/prof_$shape.ncu-rep" --page source --csv --print-source sass \
        > "/tmp/src_$shape.csv" 2>&1 && gzip -c "/tmp/src_$shape.csv" > "$OUT/src_$shape.csv.gz"
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Block Limit|Executed Ipc|Stall" \
        "$OUT/ncu_$shape.txt" | head -n 60
done

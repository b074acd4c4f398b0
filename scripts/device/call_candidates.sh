export OUT; source scripts/device/peers.sh >/dev/null 2>&1; nvidia-smi -L
P="timeout 150 python3 benchmarks/bench_kernel.py --grid --no-peers"
$P --baseline .baseline/sw --json $OUT/sw.json --shapes T8192_H64,T8192_H96,varlen1024x8_H64,T32768_H32 > $OUT/sw.log 2>&1; echo sw $?; tail -7 $OUT/sw.log
$P --baseline .baseline/inv --json $OUT/inv.json --shapes T8192_H64,varlen1024x8_H64,B8_T4096_H32_state,varlen6_H64 > $OUT/inv.log 2>&1; echo inv $?; tail -7 $OUT/inv.log
$P --baseline .baseline/cap --baseline-graph --json $OUT/cap.json --shapes T1024_H16,T2048_H32,B16_T1024_H32,T4096_H8_state > $OUT/cap.log 2>&1; echo cap $?; tail -8 $OUT/cap.log
timeout 150 python3 benchmarks/decode_probe.py --json $OUT/decode_probe.json > $OUT/decode_probe.log 2>&1; echo probe $?; tail -9 $OUT/decode_probe.log

#!/usr/bin/env bash
# Do one_gpu_rig_test's stalls come from its staged copies sharing copy-engine queues (docs/rig.md)?
# Runs the test in fresh processes, alternating GTP_RIG_STAGE=copy-engine (cudaMemcpyAsync, the
# default) and GTP_RIG_STAGE=kernel (rig::copy_bytes), each under a per-process limit (a passing run
# takes about 1.5 s on an H100; a stall is killed at the limit and counted), then the kernel mode once
# under compute-sanitizer memcheck with host-rendezvous flags (bench/rig_h200.sh's memcheck cases).
# Binaries from tools/stage-gpu.sh (.carry/bin). Writes $OUT/rig_stage.json (one record per process) and the logs of failed runs.
#   GTP_RIG_STAGE_RUNS   processes per mode (default 10)
#   GTP_RIG_STAGE_LIMIT  seconds per process (default 10)
set -uo pipefail
source bench/gpu_env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER GTP_RIG_WATCHDOG_S=6
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out/logs"
runs=${GTP_RIG_STAGE_RUNS:-10} limit=${GTP_RIG_STAGE_LIMIT:-10}
records=() memcheck_rc=null
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
write_json() {  # after every process, so a call cut short still leaves what it measured
  {
    echo "{\"machine\": \"$gpu\", \"commit\": \"${GTP_COMMIT:-unknown}\","
    echo " \"command\": \"GTP_RIG_STAGE_RUNS=$runs GTP_RIG_STAGE_LIMIT=$limit bench/rig_stage_h200.sh\","
    echo " \"memcheck_kernel_stage_rc\": $memcheck_rc, \"runs\": ["
    (IFS=,; echo "  ${records[*]}")
    echo "]}"
  } >"$out/rig_stage.json"
}
for ((i = 0; i < runs; ++i)); do
  for mode in copy-engine kernel; do
    log="$out/logs/$mode-$i.log"
    start=$EPOCHREALTIME
    GTP_RIG_STAGE=$mode timeout -s KILL "$limit" stdbuf -oL -eL .carry/bin/one_gpu_rig_test --gtest_brief=1 >"$log" 2>&1
    rc=$?
    wall=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
    [ $rc -eq 0 ] && rm -f "$log"
    records+=("{\"mode\": \"$mode\", \"run\": $i, \"rc\": $rc, \"wall_s\": $wall}")
    echo "$mode run $i: rc=$rc ${wall}s"
    write_json
  done
done
log="$out/logs/kernel-memcheck.log"
GTP_RIG_STAGE=kernel GTP_RIG_FLAGS=host timeout -s KILL 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
  .carry/bin/one_gpu_rig_test --gtest_brief=1 --gtest_filter='*MatchTheirDefinitions*:*Interleave*' >"$log" 2>&1
memcheck_rc=$?
echo "kernel memcheck: rc=$memcheck_rc"; tail -3 "$log"
write_json

#!/usr/bin/env bash
# The one-GPU rig on the GPU machine (issue 23): G = 2, 4, 8 ranks as threads on one GPU through the
# rig (a test double for NCCL, remat/one_gpu_rig.h). Most important first, every step under a time
# limit and the whole call under GTP_DEADLINE (seconds, default 360):
#   rig_test, rig_runtime_test       the rig's collectives, and every multi-rank runtime path bit-compared
#                                    with the host backend (flags as the rig picks them)
#   overlap_rig                      gtp-overlap-bench-rig: reduce-scatter exposure in backward, the
#                                    current grad_buffer order against the old one (rs-wait), one run
#   *_memcheck                       both tests under compute-sanitizer memcheck (API errors reported:
#                                    no NCCL in these binaries)
#   rig_runtime_kernel_flags         the runtime test at G = 4 with the rig's kernel flags
#   *_racecheck, *_synccheck         the runtime test at G = 2 under racecheck and synccheck
# Binaries from tools/stage-gpu.sh (.carry/bin). Logs and the JSON land in $OUT/rig_results.tgz; one
# summary line per step on stdout. Set GTP_COMMIT to record the commit in the JSON.
set -uo pipefail
source bench/gpu_env.sh
# Every rank's streams in their own hardware queue (remat/one_gpu_rig.h): 32 is CUDA's largest setting.
export CUDA_DEVICE_MAX_CONNECTIONS=32
# A rig that hangs ends its process with the reason (remat/internal/rig_ranks.h) before a step's limit.
export GTP_RIG_WATCHDOG_S=80
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'tar czf "$out/rig_results.tgz" -C "$work" .' EXIT
deadline=$(( $(date +%s) + ${GTP_DEADLINE:-360} ))
step() {  # step LIMIT NAME COMMAND...: log to NAME.log, one verdict line
  local limit=$1 name=$2; shift 2
  local start=$SECONDS left=$((deadline - $(date +%s)))
  if [ "$left" -lt 15 ]; then echo "== $name: skipped, the call's deadline is near"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "== $name exit $? ($((SECONDS - start)) s) :: $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|SKIPPED \]|flags by|one-GPU rig:' "$work/$name.log" | sort | uniq -c | tr '\n' ' ' | cut -c1-600)"
}
for b in one_gpu_rig_test one_gpu_rig_runtime_test gtp-overlap-bench-rig; do
  [ -x "$bin/$b" ] || echo "== $b: not in $bin (run tools/stage-gpu.sh)"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
step 90 rig_test $bin/one_gpu_rig_test
step 200 rig_runtime_test $bin/one_gpu_rig_runtime_test
step 120 overlap_rig $bin/gtp-overlap-bench-rig --ranks 4 --m 2048 --n 4096 --k 4096 --layers 8 --wires bf16,fp8 \
  --depths 1 --iters 10 --warmup 3 --json "$work/overlap_rig_bench.json"
grep -E "^(rs-wait|current|gtp-overlap-bench-rig)" "$work/overlap_rig.log"
step 150 rig_test_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 $bin/one_gpu_rig_test --gtest_brief=1
step 200 rig_runtime_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 $bin/one_gpu_rig_runtime_test \
  --gtest_brief=1 --gtest_filter='*G2:*CapturedStep*G4'
step 120 rig_runtime_kernel_flags env GTP_RIG_FLAGS=kernels $bin/one_gpu_rig_runtime_test --gtest_brief=1 \
  --gtest_filter='*G4'
for tool in racecheck synccheck; do
  step 120 "rig_runtime_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $bin/one_gpu_rig_runtime_test \
    --gtest_brief=1 --gtest_filter='*EveryWire*G2:*CapturedStep*G2'
done
step 60 overlap_rig_g8 $bin/gtp-overlap-bench-rig --ranks 8 --m 1024 --n 4096 --k 4096 --layers 8 --wires bf16 \
  --depths 1 --iters 10 --warmup 3 --json "$work/overlap_rig_bench_g8.json"
grep -E "^(rs-wait|current)" "$work/overlap_rig_g8.log"

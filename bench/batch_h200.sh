#!/usr/bin/env bash
# Issue 21, the CUDA backend's collective batches, on the GPU machine (one GPU; a second one adds the
# two-rank fill-tag case and the bench's G = 2 row): a cancelled batch enqueues nothing, on NCCL and
# on the rig's test transport (cuda_failure_test, the rig tests at G = 2); the fill-tag check plain
# and under compute-sanitizer memcheck (API errors not reported: NCCL probes kernels without an sm_90
# image); the other GPU tests whose batches go through the changed code; then the check's cost per
# fill and per submission (fill_tag_cuda_bench: one JSON line). Binaries from tools/stage-gpu.sh
# (.carry/bin); logs in $OUT; one summary line per step. About 1-2 minutes, at most GTP_DEADLINE s.
# Staging only what it runs keeps .carry small:
#   tools/stage-gpu.sh //remat:cuda_failure_test //remat:cuda_fill_tags_test //remat:cuda_backend_test \
#     //remat:cuda_stream_capture_test //remat:cuda_fill_graphs_test //remat:one_gpu_rig_test \
#     //remat:one_gpu_rig_runtime_test //bench/remat:fill_tag_cuda_bench
#   bash bench/batch_h200.sh
set -uo pipefail
source bench/gpu_env.sh
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
bin=.carry/bin
deadline=$(( $(date +%s) + ${GTP_DEADLINE:-170} ))
status=0
step() {  # step LIMIT NAME COMMAND...
  local limit=$1 name=$2; shift 2
  local start=$SECONDS left=$((deadline - $(date +%s)))
  if [ "$left" -lt 10 ]; then echo "== $name: skipped, the deadline is near"; status=1; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout -k 5 "$limit" stdbuf -oL -eL "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $name exit $rc ($((SECONDS - start)) s) :: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] [A-Z].*\(|ERROR SUMMARY' "$out/$name.log" | tr '\n' ' ' | cut -c1-600)"
  if [ $rc -ne 0 ]; then tail -n 8 "$out/$name.log" | sed 's/^/   | /'; fi
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
step 60 cuda_failure_test $bin/cuda_failure_test
step 60 cuda_fill_tags_test $bin/cuda_fill_tags_test
# Without the held-stream case: it holds the GPU with a host function that waits for a flag the host
# raises after enqueueing, which compute-sanitizer's serialized launches never reach (30 s timeout).
step 90 cuda_fill_tags_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
  $bin/cuda_fill_tags_test --gtest_filter='-*NoSlotIsReusedBeforeItsCopyRan*'
step 60 cuda_failure_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
  $bin/cuda_failure_test
for t in cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test; do
  step 60 "$t" $bin/$t --gtest_brief=1
done
step 60 rig_test_g2 $bin/one_gpu_rig_test --gtest_filter='*G1:*G2'
step 90 rig_runtime_test_g2 $bin/one_gpu_rig_runtime_test --gtest_filter='*G2'
step 60 fill_tag_cuda_bench $bin/fill_tag_cuda_bench
grep -E '^\{' "$out/fill_tag_cuda_bench.log"
exit $status

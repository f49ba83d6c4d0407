#!/usr/bin/env bash
# Failing ranks on the GPU (docs/reliability.md): the CUDA-only parts of issue 21's "ranks that fail"
# and the GPU tests whose code they touched, from binaries staged by tools/stage-gpu.sh (.carry/).
# Each test's log lands in $OUT; one summary line per test on stdout. About 2 minutes.
set -uo pipefail
source bench/gpu_env.sh
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
bin=.carry/bin
status=0
for t in cuda_failure_test gtp_cuda_watchdog_test cuda_backend_test gtp_cuda_test nccl_test cuda_graph_test \
         gtp_cuda_graph_test; do
  timeout 180 "$bin/$t" > "$out/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $t exit $rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
done
exit $status

#!/usr/bin/env bash
# Issue 21, ranks that disagree, on the GPU machine (2 GPUs for the two-rank case; one runs the rest):
# the fill-tag check's GPU test plain and under compute-sanitizer memcheck, the CUDA backend's other
# GPU tests (the check's buffers and batch hooks run in all of them), the check's cost per fill
# (fill_tag_cuda_bench) and the remat host-overhead benchmark through the C ABI on GTP_BACKEND_CUDA
# (P6; size-1 group, where the runtime skips the check: it must match perf-history's v6 figures).
# Binaries from tools/stage-gpu.sh (.carry/). Logs and JSON in $OUT.
#   bash bench/diverge_h200.sh
set -uo pipefail
source bench/gpu_env.sh
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
bin=.carry/bin
step() {  # step LIMIT NAME COMMAND...
  local limit=$1 name=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "== $name exit $? ($((SECONDS - start)) s)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|^\{" "$out/$name.log" | head -12
}
step 180 cuda_fill_tags_test $bin/cuda_fill_tags_test
# Not the ring-reuse case: it holds the GPU with a gate kernel while the host enqueues, and under
# compute-sanitizer the host's enqueues wait for that kernel (the gate times out; 0 memory errors).
step 180 cuda_fill_tags_memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
  $bin/cuda_fill_tags_test --gtest_filter='-*NoSlotIsReusedBeforeItsCopyRan'
for t in cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test cuda_graph_test gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test; do
  step 120 "$t" $bin/$t --gtest_brief=1
done
step 120 fill_tag_cuda_bench $bin/fill_tag_cuda_bench
step 240 remat_capi_cuda $bin/c_abi_overhead_bench --benchmark_filter='backend:1' --benchmark_min_time=0.1 \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/remat_overhead_capi_gpu_diverge.json" --benchmark_out_format=json \
  --benchmark_context=commit="${GTP_COMMIT:-unknown}"
# name and us_per_weight of each median row
awk '/_median/ { for (i = 1; i <= NF; i++) if ($i ~ /^us_per_weight=/) print $1, $i }' "$out/remat_capi_cuda.log" | head -40

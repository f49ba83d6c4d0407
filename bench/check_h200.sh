#!/usr/bin/env bash
# Correctness on the GPU machine, logged to $OUT: the kernel tests with compute-sanitizer memcheck and
# racecheck, the comm GPU tests, then the remat runtime's and the C ABI's GPU tests (cuda_backend_test,
# cuda_stream_capture_test, cuda_fill_graphs_test, cuda_graph_test, gtp_cuda_test, gtp_cuda_graph_test) plain, under
# memcheck and (the runtime's graph test) racecheck and synccheck.
# Prints one summary line per step; each step has a time limit (GTP_STEP_LIMIT seconds, default 240)
# so one hung step cannot take the whole call. Steps whose binary is not in .carry/bin are skipped.
#   bench/check_h200.sh [tests|sanitizers|all]     (default all)
set -uo pipefail
what=${1:-all}
source bench/gpu_env.sh
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
limit=${GTP_STEP_LIMIT:-240}
mkdir -p "$out"
# GTP_DEADLINE_EPOCH (seconds since the epoch, optional): no step runs past it (the caller's budget).
step() {  # step NAME COMMAND...: runs it, keeps the log, prints the verdict lines
  local name=$1; shift
  local start=$SECONDS step_limit=$limit
  if [ -n "${GTP_DEADLINE_EPOCH:-}" ]; then
    local left=$((GTP_DEADLINE_EPOCH - $(date +%s)))
    if [ "$left" -lt 15 ]; then echo "== $name: skipped, the call's deadline is near"; return; fi
    [ "$left" -lt "$step_limit" ] && step_limit=$left
  fi
  timeout "$step_limit" "$@" > "$out/$name.log" 2>&1
  echo "== $name exit $? ($((SECONDS - start)) s) :: $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|SKIPPED \]' "$out/$name.log" | tr '\n' ' ')"
}
if [ "$what" != sanitizers ]; then
  step kernel_tests $bin/cuda_kernels_test --gtest_brief=1
  for t in cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test cuda_graph_test gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test gtp_shared_use_test; do
    if [ ! -x "$bin/$t" ]; then echo "== $t: not in $bin, skipped"; continue; fi
    step "$t" $bin/$t --gtest_brief=1
  done
  step nccl_test $bin/nccl_test --gtest_brief=1
  step streams_test $bin/streams_test --gtest_brief=1
fi
if [ "$what" != tests ]; then
  step memcheck env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 $bin/cuda_kernels_test --gtest_brief=1
  step racecheck env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 $bin/cuda_kernels_test --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*'
  # These tests run NCCL, whose init probes its kernels with cudaFuncGetAttributes and gets
  # cudaErrorNoKernelImageForDevice for architectures its build lacks (12-16 such API errors, all
  # inside libnccl, in the 2026-12-02 run); memcheck counts them as errors. API error reporting is
  # off here so the exit code reflects memory errors in our kernels and the runtime.
  for t in cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test cuda_graph_test gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test gtp_shared_use_test; do
    [ -x "$bin/$t" ] || continue
    step "${t}_memcheck" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/$t --gtest_brief=1
  done
  if [ -x "$bin/cuda_graph_test" ]; then
    for tool in racecheck synccheck; do
      step "cuda_graph_test_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $bin/cuda_graph_test --gtest_brief=1
    done
  fi
fi

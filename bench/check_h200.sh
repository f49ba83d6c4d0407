#!/usr/bin/env bash
# Correctness on the GPU machine, logged to $OUT: kernel tests, compute-sanitizer memcheck and
# racecheck, and the comm GPU tests. Prints one summary line per step.
set -uo pipefail
source bench/gpu_env.sh
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
step() {  # step NAME COMMAND...: runs it, keeps the log, prints the verdict lines
  local name=$1; shift
  "$@" > "$out/$name.log" 2>&1
  echo "== $name exit $? :: $(grep -E 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|SKIPPED \]' "$out/$name.log" | tr '\n' ' ')"
}
step kernel_tests $bin/cuda_kernels_test --gtest_brief=1
step memcheck env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 $bin/cuda_kernels_test --gtest_brief=1
step racecheck env GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 $bin/cuda_kernels_test --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*'
step nccl_test $bin/nccl_test --gtest_brief=1
step streams_test $bin/streams_test --gtest_brief=1

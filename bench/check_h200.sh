#!/usr/bin/env bash
# Correctness on the GPU machine, logged to $OUT: kernel tests, compute-sanitizer memcheck and
# racecheck, the comm GPU tests, then the remat runtime's GPU tests (cuda_backend_test, cuda_graph_test
# and the C ABI's CUDA test when built) plain and under memcheck, racecheck and synccheck. Prints one
# summary line per step. Steps whose binary is not in .carry/bin are skipped, saying so.
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
for t in cuda_backend_test cuda_graph_test gtp_cuda_test; do
  if [ ! -x "$bin/$t" ]; then echo "== $t: not in $bin, skipped"; continue; fi
  step "$t" $bin/$t --gtest_brief=1
  for tool in memcheck racecheck synccheck; do
    step "${t}_$tool" compute-sanitizer --tool $tool --error-exitcode 9 $bin/$t --gtest_brief=1
  done
done

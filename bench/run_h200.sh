#!/usr/bin/env bash
# Runs on the GPU machine (no Bazel there): the kernel tests, compute-sanitizer memcheck and
# racecheck on them, the kernel benchmark and the torch.compile peer, in one call. Binaries come
# prebuilt (bazel build -c opt) in .carry/bin; results go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
nvidia-smi -L
echo "== kernel tests"
$bin/cuda_kernels_test --gtest_brief=1 2>&1 | tail -n 15
echo "== compute-sanitizer memcheck"
GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/cuda_kernels_test --gtest_brief=1 2>&1 | tail -n 6
echo "memcheck exit: $?"
echo "== compute-sanitizer racecheck"
GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/cuda_kernels_test --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*' 2>&1 | tail -n 6
echo "racecheck exit: $?"
echo "== kernel benchmark"
$bin/gtp-kernel-bench --json "$out/kernel_bench.json" 2>&1
echo "== torch.compile peer"
PYTHONUNBUFFERED=1 python3 bench/peers/torch_quant_peer.py --json "$out/torch_peer.json" 2>&1 | grep -v Warning

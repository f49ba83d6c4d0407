#!/usr/bin/env bash
# Runs on the GPU machine (no Bazel there), in one call: the kernel tests, compute-sanitizer
# memcheck and racecheck on them, the kernel benchmark and its torch.compile peer, then the comm
# GPU tests and collective benchmark (bench/collectives/run_gpu.sh). Binaries come prebuilt
# (bazel build -c opt) in .carry/bin; results go to $OUT. Set GTP_COMMIT to record the commit.
#   bench/run_h200.sh [kernels|comm|topology|all]     (default all)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
what=${1:-all}
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
# NCCL and UCX come from the machine; fall back to a pip-installed NCCL and carried UCX libraries.
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
fi
{ ldconfig -p | grep -q libucp.so.0 && ldconfig -p | grep -q libhwloc.so.15; } ||
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.carry/lib"
nvidia-smi -L
if [ "$what" = topology ] || [ "$what" = all ]; then
  echo "== gtp-topo probe (live machine: hwloc + CUDA driver + NVML)"
  $bin/gtp-topo probe 2>&1
  $bin/gtp-topo probe --json > "$out/h200_topology.json" 2>&1
fi
if [ "$what" = kernels ] || [ "$what" = all ]; then
  echo "== kernel tests"
  $bin/cuda_kernels_test --gtest_brief=1 2>&1 | tail -n 15
  echo "== compute-sanitizer memcheck"
  GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $bin/cuda_kernels_test --gtest_brief=1 2>&1 | tail -n 4
  echo "memcheck exit: ${PIPESTATUS[0]}"
  echo "== compute-sanitizer racecheck"
  GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $bin/cuda_kernels_test --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*' 2>&1 | tail -n 4
  echo "racecheck exit: ${PIPESTATUS[0]}"
  echo "== kernel benchmark"
  $bin/gtp-kernel-bench --json "$out/kernel_bench.json" 2>&1
  echo "== torch.compile peer"
  PYTHONUNBUFFERED=1 python3 bench/peers/torch_quant_peer.py --json "$out/torch_peer.json" 2>&1 | grep -v Warning
fi
if [ "$what" = comm ] || [ "$what" = all ]; then
  GTP_BIN=$bin bash bench/collectives/run_gpu.sh
fi

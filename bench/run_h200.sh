#!/usr/bin/env bash
# Runs on the GPU machine (no Bazel there), in one call: the kernel tests, compute-sanitizer
# memcheck and racecheck on them, the kernel benchmark and its torch.compile peer, the comm GPU
# tests and collective benchmark (bench/collectives/run_gpu.sh), then the overlap benchmark
# (gtp-overlap-bench). Binaries come prebuilt (bazel build -c opt) in .carry/bin; results go to
# $OUT. Set GTP_COMMIT to record the commit.
#   bench/run_h200.sh [kernels|comm|topology|remat|overlap|all]     (default all)
# remat: the runtime's host overhead per weight on the CUDA backend (cuda_overhead_bench; it needs
# libbenchmark.so.1debian, carried in .carry/lib) -> $OUT/remat_overhead_gpu.json, and the same through
# the C ABI (c_abi_overhead_bench) -> $OUT/remat_overhead_capi_gpu.json.
set -uo pipefail
what=${1:-all}
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
source bench/gpu_env.sh
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
if [ "$what" = remat ] || [ "$what" = all ]; then
  echo "== remat host overhead on the CUDA backend"
  LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.carry/lib" $bin/cuda_overhead_bench --benchmark_min_time=0.1 \
    --benchmark_out="$out/remat_overhead_gpu.json" --benchmark_out_format=json \
    --benchmark_context=commit="${GTP_COMMIT:-unknown}" 2>&1
  echo "== remat host overhead through the C ABI (host backend, then GTP_BACKEND_CUDA)"
  LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.carry/lib" $bin/c_abi_overhead_bench --benchmark_min_time=0.1 \
    --benchmark_out="$out/remat_overhead_capi_gpu.json" --benchmark_out_format=json \
    --benchmark_context=commit="${GTP_COMMIT:-unknown}" 2>&1
fi
if [ "$what" = comm ] || [ "$what" = all ]; then
  GTP_BIN=$bin bash bench/collectives/run_gpu.sh
fi
if [ "$what" = overlap ] || [ "$what" = all ]; then
  echo "== gtp-overlap-bench (one GPU: the gather is a size-1 communicator's device copy)"
  $bin/gtp-overlap-bench --json "$out/overlap_bench.json" 2>&1
  echo "gtp-overlap-bench exit: $?"
  echo "== gtp-overlap-bench, 4 microbatches a step (wgrads accumulated: one reduce-scatter per weight per step)"
  $bin/gtp-overlap-bench --microbatches 4 --wires bf16,nvfp4 --json "$out/overlap_bench_mb4.json" 2>&1
  echo "gtp-overlap-bench exit: $?"
  for keep in off on; do
    echo "== gtp-overlap-bench, 4 microbatches, weights re-packed every step, keep_gathered $keep"
    $bin/gtp-overlap-bench --microbatches 4 --wires bf16,nvfp4 --depths 2 --priorities high --repack on \
      --keep-gathered $keep --json "$out/overlap_bench_mb4_repack_keep_$keep.json" 2>&1
    echo "gtp-overlap-bench exit: $?"
  done
  # The same with keep_gathered, the wgrads through the size-1 communicator's reduce-scatter and the
  # deferred add instead of straight into the main grads (what the runs above do by default at G = 1).
  echo "== gtp-overlap-bench, 4 microbatches, re-packed every step, keep_gathered on, grads into main grad off"
  $bin/gtp-overlap-bench --microbatches 4 --wires bf16,nvfp4 --depths 2 --priorities high --repack on \
    --keep-gathered on --grads-into-main-grad off --json "$out/overlap_bench_mb4_repack_keep_on_buffers.json" 2>&1
  echo "gtp-overlap-bench exit: $?"
fi

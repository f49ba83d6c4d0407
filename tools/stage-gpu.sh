#!/usr/bin/env bash
# Builds every binary the GPU-machine scripts run (bazel build -c opt) and stages them, with the
# shared libraries that machine's image may lack, in .carry/ (bin/, lib/): the device tool carries
# that folder, and bench/final_h200.sh (or bench/run_h200.sh, bench/check_h200.sh) runs from it.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(
  //kernels:cuda_kernels_test //bench:gtp-kernel-bench //comm:nccl_test //comm:streams_test
  //comm:gtp-launch //comm:cluster_setup_test //comm:cluster_setup_worker //bench/collectives:gtp-bench
  //topology:gtp-topo //remat:cuda_backend_test //remat:cuda_stream_capture_test //remat:cuda_fill_graphs_test //remat:cuda_graph_test //bindings/c:gtp_cuda_test //bindings/c:gtp_cuda_graph_test
  //bindings/c:gtp_fp8_gemm_test //remat:cuda_fill_tags_test //bench/remat:fill_tag_cuda_bench
  //remat:cuda_failure_test //bindings/c:gtp_cuda_watchdog_test
  //bench/remat:cuda_overhead_bench //bench/remat:c_abi_overhead_bench //bench/overlap:gtp-overlap-bench //bindings/c:libgtp.so
  //remat:one_gpu_rig_test //remat:one_gpu_rig_runtime_test //bench/overlap:gtp-overlap-bench-rig
  //bench/rig:gtp-graph-launch-probe //bindings/c:gtp_shared_use_test
  //remat:one_gpu_rig_diverge_test //bench/remat:fill_tag_rig_bench
)
# Targets given as arguments replace the list (a smaller .carry for one script, e.g. bench/batch_h200.sh).
[ $# -gt 0 ] && targets=("$@")
bazel build -c opt "${targets[@]}"
rm -rf .carry && mkdir -p .carry/bin .carry/lib
for t in "${targets[@]}"; do
  path=${t#//}
  cp -f "bazel-bin/${path/://}" .carry/bin/
done
# Host libraries the binaries link that the GPU image may not have (bench/gpu_env.sh puts .carry/lib
# on LD_LIBRARY_PATH only when ldconfig lacks them). NCCL and cuBLAS come from that machine.
for lib in libbenchmark.so.1debian libhwloc.so.15 libnuma.so.1 libucm.so.0 libucp.so.0 libucs.so.0 libuct.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .carry/lib/
done
echo "stage-gpu: $(ls .carry/bin | wc -l) binaries and $(ls .carry/lib | wc -l) libraries in .carry ($(du -sh .carry | cut -f1))"
# The device tool carries at most 64 MiB (working tree and .carry together).
if [ "$(du -sm .carry | cut -f1)" -gt 56 ]; then
  echo "stage-gpu: .carry is over 56 MiB; remove from .carry/bin the binaries this GPU call does not run" \
       "(the device tool carries 64 MiB with the working tree)"
fi

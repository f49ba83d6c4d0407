#!/usr/bin/env bash
# Stages everything one GPU-machine call needs into ONE archive, .gpu/gtp-gpu.tar.xz (ignored), for
# tools/gpu/run.sh: every GPU binary and libgtp.so (bazel build -c opt) in bin/, the host libraries
# they link that the GPU image may lack in lib/, and in wheels/, when ../shared/te-h200 is beside the
# checkout, the TransformerEngine 2.20.2 bundle, the Megatron-Core 0.19.2 wheel, psutil's wheel and in
# wheels/bridge/ Megatron Bridge 0.6.2 with what its GPU run imports (tools/gpu/bridge_wheels.py)
# (the GPU machine has no network); COMMIT names the commit. The Python files travel with the
# checkout itself. The device tool carries 64 MiB with the working tree: this script prints both
# sizes and fails above that.
#   tools/gpu/stage.sh            build and pack
#   GTP_STAGE_NO_BUILD=1 tools/gpu/stage.sh   pack what bazel-bin already holds (after a build)
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(
  //kernels:cuda_kernels_test //bench:gtp-kernel-bench //comm:nccl_test //comm:streams_test
  //comm:gtp-launch //comm:cluster_setup_test //comm:cluster_setup_worker //bench/collectives:gtp-bench
  //topology:gtp-topo //remat:cuda_backend_test //remat:cuda_stream_capture_test //remat:cuda_fill_graphs_test
  //remat:cuda_graph_test //bindings/c:gtp_cuda_test //bindings/c:gtp_cuda_graph_test
  //bindings/c:gtp_fp8_gemm_test //remat:cuda_fill_tags_test //bench/remat:fill_tag_cuda_bench
  //remat:cuda_failure_test //bindings/c:gtp_cuda_watchdog_test
  //bench/remat:cuda_overhead_bench //bench/remat:c_abi_overhead_bench //bench/overlap:gtp-overlap-bench
  //bindings/c:libgtp.so //bindings/c:gtp_shared_use_test
  //testing/rig:one_gpu_rig_test //testing/rig:one_gpu_rig_diverge_test //testing/rig:gtp-graph-launch-probe
  //tests/real_peers:runtime_worker //tests/real_peers:failure_worker //tests/real_peers:real_peers_runtime_test
  //tests/real_peers:real_peers_failure_test
)
shared=../shared/te-h200
stage=.gpu/stage archive=.gpu/gtp-gpu.tar.xz
[ "${GTP_STAGE_NO_BUILD:-0}" = 1 ] || bazel build -c opt "${targets[@]}"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$stage/wheels"
for t in "${targets[@]}"; do
  path=${t#//}
  cp -f "bazel-bin/${path/://}" "$stage/bin/"
done
# Host libraries the binaries link that the GPU image may not have (run.sh puts lib/ on
# LD_LIBRARY_PATH only when ldconfig lacks them). NCCL and cuBLAS come from that machine.
for lib in libbenchmark.so.1debian libhwloc.so.15 libnuma.so.1 libucm.so.0 libucp.so.0 libucs.so.0 libuct.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$stage/lib/"
done
if [ -f "$shared/te_bundle_sm90_cp312.tar.xz" ]; then
  cp "$shared/te_bundle_sm90_cp312.tar.xz" "$stage/wheels/"
  wheel=$(ls "$shared"/megatron_core-0.19.2-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] && cp "$wheel" "$stage/wheels/"
  # Megatron-Core's torch_dist writer imports psutil, which the GPU image may lack: its abi3 wheel
  # (pinned as in tools/constraints.txt), unpacked there only when `import psutil` fails.
  psutil=$(grep -i '^psutil==' tools/constraints.txt | cut -d= -f3)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: --python-version 3.12 \
    --platform manylinux2014_x86_64 "psutil==$psutil" -d "$stage/wheels" ||
    echo "stage: pip could not download psutil==$psutil: the megatron step's checkpoint part needs it where the GPU image lacks it" >&2
  # Megatron Bridge 0.6.2 and the few packages its GPU run imports (tools/gpu/bridge_wheels.py says which
  # and why; the rest Bridge imports at load are test doubles there): the bridge step.
  python3 tools/gpu/bridge_wheels.py stage "$stage/wheels/bridge" ||
    echo "stage: the Bridge wheels could not be downloaded: the bridge step will say they are not staged" >&2
else
  echo "stage: $shared not found: the te_*, megatron, peers, h2h and bridge steps will say that TE is not staged" >&2
fi
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit+="-dirty"
echo "$commit" > "$stage/COMMIT"
# Binaries compress about tenfold; the TE bundle is xz already.
XZ_OPT=${XZ_OPT:--6 -T2} tar cJf "$archive" -C "$stage" .
archive_mib=$(( ($(stat -c %s "$archive") + 1048575) / 1048576 ))
tree_mib=$(( ($(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s }') + 1048575) / 1048576 ))
echo "stage: $archive is ${archive_mib} MiB ($(ls "$stage/bin" | wc -l) binaries, $(ls "$stage/lib" | wc -l) libraries," \
     "wheels: $(ls "$stage/wheels" | tr '\n' ' ')$([ -d "$stage/wheels/bridge" ] && echo "bridge: $(ls "$stage/wheels/bridge" | wc -l) distributions, $(du -sm "$stage/wheels/bridge" | cut -f1) MiB unpacked")); with the ${tree_mib} MiB working tree $((archive_mib + tree_mib)) MiB of 64;" \
     "commit $commit"
if [ $((archive_mib + tree_mib)) -gt 64 ]; then
  echo "stage: over the 64 MiB the device tool carries" >&2
  exit 1
fi
echo "stage: carry .gpu/gtp-gpu.tar.xz and run e.g.: bash tools/gpu/run.sh tests sanitizers"

#!/usr/bin/env bash
# Runs on the GPU machine (no Bazel there): the comm GPU tests and the collective benchmark, one rank
# per visible GPU. Binaries come prebuilt (bazel build -c opt, see docs/comm.md) in $GTP_BIN
# (default .carry/bin); JSON results go to $OUT. Set GTP_COMMIT to record the commit in the JSON.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
bin=${GTP_BIN:-.carry/bin}
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
nvidia-smi -L
gpus=$(nvidia-smi -L | wc -l)
echo "== nccl_test"
"$bin/nccl_test" --gtest_brief=1 2>&1 | tail -n 20
echo "== streams_test"
"$bin/streams_test" --gtest_brief=1 2>&1 | tail -n 20
echo "== gtp-bench all_gather (bf16, the GTP wire) on $gpus GPU(s)"
"$bin/gtp-launch" -n "$gpus" --timeout 540 -- "$bin/gtp-bench" all_gather -b 1M -e 1G -f 4 -n 20 -w 5 \
  -d bfloat16 --json "$out/comm_all_gather_bf16.json"
echo "== gtp-bench reduce_scatter (fp32 sum, the grad finalize) on $gpus GPU(s)"
"$bin/gtp-launch" -n "$gpus" --timeout 540 -- "$bin/gtp-bench" reduce_scatter -b 1M -e 1G -f 4 -n 20 -w 5 \
  -d float -o sum --json "$out/comm_reduce_scatter_fp32.json"
echo "== cluster_setup_test (live discovery and binding on this machine)"
"$bin/cluster_setup_test" "$bin/gtp-launch" "$bin/cluster_setup_worker" --gtest_brief=1 \
  --gtest_filter='ClusterSetup.LiveDiscovery*:ClusterSetup.Bind*' 2>&1 | tail -n 20
echo "== setup_cluster + bind_rank on $gpus live ranks (TP 1, G $gpus): one GPU and its NUMA cpuset each"
mkdir -p "$out/cluster_setup"
"$bin/gtp-launch" -n "$gpus" --timeout 120 -- "$bin/cluster_setup_worker" live 1 "$gpus" "$out/cluster_setup"
for format in bf16 fp8 mxfp8 nvfp4; do
  echo "== gtp-bench all_gather --format $format: checked against the CPU reference"
  "$bin/gtp-launch" -n "$gpus" --timeout 300 -- "$bin/gtp-bench" all_gather -b 4M -e 64M -f 4 -n 2 -w 1 \
    -c 1 --format "$format"
  echo "== gtp-bench all_gather --format $format (pack + gather + unpack vs the BF16 gather) on $gpus GPU(s)"
  "$bin/gtp-launch" -n "$gpus" --timeout 300 -- "$bin/gtp-bench" all_gather -b 16M -e 1G -f 4 -n 20 -w 5 \
    -c 0 --format "$format" --json "$out/comm_all_gather_wire_$format.json"
done

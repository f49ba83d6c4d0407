#!/usr/bin/env bash
# Issue 7's multi-GPU validation in one device call on nvidia-h200-x8 (or -x4 / -x2): N = the visible
# GPUs (at least 2, else exit 2), one rank per GPU, NCCL_NVLS_ENABLE=0 (bench/gpu_env.sh). Most
# important first, every step under a time limit and the call's deadline, every log kept:
#   1. gtp-bench all_gather (BF16, 1 MiB - 4 GiB) over the gtp_remat group of size N: raw NCCL and
#      libgtp's streams in the same run; then --format fp8 / mxfp8 / nvfp4 end to end (64 MiB - 1 GiB);
#      then reduce_scatter (FP32 sum, the grad finalize, 1 MiB - 4 GiB);
#   2. the FSDP2 peer (bench/peers/fsdp2_allgather_peer.py): fully_shard's all-gather, same sizes;
#   3. gtp-overlap-bench with G = N under gtp-launch --bootstrap ucx (B = 1);
#   4. train_gpt.py with G = N on the CUDA backend (GTP off vs every wire), then the BF16 run's
#      checkpoint re-sharded and resumed at G = N/2;
#   5. the GPU tests' two-GPU cases, which skip on one GPU (real NCCL peers, two ranks): the fill-tag
#      check with ranks that gather different weights (cuda_fill_tags_test), a failure inside a
#      collective on one rank (cuda_failure_test), communicator pairs that differ (cuda_backend_test,
#      nccl_test), and fill_tag_cuda_bench's G = 2 row;
#   6. extras while time is left: train_gpt.py with fill graphs (BF16, FP8: the fills recorded and
#      launched as CUDA graphs over N ranks, NCCL's rule for captured collectives across GPUs);
#      gtp-overlap-bench with 4 microbatches; all_gather and reduce_scatter
#      over gtp_remat groups of size N/2 (N >= 4: a TP 2 profile); every --format checked bit-exact
#      against the CPU reference (-c 1, small sizes).
# Then bench/multi_gpu_summary.py prints the tables against the targets. Everything lands in
# $OUT/multi_gpu_results.tgz. Binaries come from tools/stage-gpu.sh (.carry/); torch from the machine.
#   bash bench/multi_gpu_h200.sh [all|collectives|peer|overlap|train|pairs|extras]   (default all)
#   bash bench/multi_gpu_h200.sh profile N TP PATH   (writes the grid profile the sweeps use; no GPU)
# GTP_DEADLINE (seconds, default 540): steps that would run past it are cut or skipped (named in the
# output: run them with a second call, e.g. `bash bench/multi_gpu_h200.sh train`). GTP_COMMIT goes
# into the JSON. GTP_OVERLAP_M fixes the overlap benchmark's M (default auto: each rank sizes itself).
set -uo pipefail

# A profile of N ranks on one host of N GPUs: TP = tp, gtp_remat groups of N / tp ranks (DP 1).
write_profile() {
  local n=$1 tp=$2 path=$3 gpus="" i
  for ((i = 0; i < n; i++)); do gpus+="${gpus:+, }{\"index\": $i}"; done
  cat > "$path" <<EOF
{"schema_version": 1, "name": "multi-gpu-h200-tp$tp",
 "cluster": {"template": {"host_count": 1, "host": {"gpus": [$gpus]}}},
 "parallel": {"world_size": $n, "tensor_model_parallel_size": $tp, "tensor_parallel_num_weight_shards": $n}}
EOF
}

what=${1:-all}
if [ "$what" = profile ]; then
  [ $# -eq 4 ] || { echo "usage: $0 profile N TP PATH" >&2; exit 2; }
  write_profile "$2" "$3" "$4"
  exit
fi
case $what in all | collectives | peer | overlap | train | pairs | extras) ;; *)
  echo "multi_gpu_h200.sh: unknown step '$what'; use all, collectives, peer, overlap, train, pairs, extras or profile" >&2
  exit 2 ;;
esac

# The visible GPUs: CUDA_VISIBLE_DEVICES when set (possibly empty), else nvidia-smi's list.
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  gpus=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ "$gpus" -lt 2 ]; then
  echo "multi_gpu_h200.sh: $gpus GPU(s) visible; issue 7 needs at least 2: run it on nvidia-h200-x8 (or -x4, -x2)" >&2
  exit 2
fi
n=$gpus
half=$((n / 2))

source bench/gpu_env.sh
export GTP_DEADLINE_EPOCH=$(( $(date +%s) + ${GTP_DEADLINE:-540} ))
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'tar czf "$out/multi_gpu_results.tgz" -C "$work" .' EXIT
export OUT=$work
bin=.carry/bin
launch="$bin/gtp-launch -n $n --"
export GTP_LIBRARY=$PWD/.carry/bin/libgtp.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

skipped=()
timed() {  # timed LIMIT NAME COMMAND...: output to NAME.log, one line with the exit code and seconds
  local limit=$1 name=$2; shift 2
  local start=$SECONDS left=$((GTP_DEADLINE_EPOCH - $(date +%s))) status
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, the call's deadline is near"
    skipped+=("$name")
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  status=$?
  echo "== $name exit $status ($((SECONDS - start)) s)"
  [ "$status" -ne 0 ] && grep -v Warning "$work/$name.log" | tail -n 12
}
wants() { [ "$what" = all ] || [ "$what" = "$1" ]; }

echo "== $n GPU(s), gtp_remat G = $n$([ "$n" -ge 4 ] && echo " and $half (TP 2)")," \
     "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE, deadline in $((GTP_DEADLINE_EPOCH - $(date +%s))) s," \
     "commit ${GTP_COMMIT:-unknown}"
nvidia-smi -L
nvidia-smi topo -m > "$work/nvidia_smi_topo.txt" 2>&1
write_profile "$n" 1 "$work/profile_g$n.json"
[ "$n" -ge 4 ] && write_profile "$n" 2 "$work/profile_g$half.json"
bench="$launch $bin/gtp-bench"
groups() { echo "--profile $work/profile_g$1.json --group gtp_remat"; }  # the gtp_remat groups of size $1

if wants collectives; then
  timed 100 ag_bf16_g$n $bench all_gather $(groups "$n") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d bfloat16 \
    --json "$work/ag_bf16_g$n.json"
  for format in fp8 mxfp8 nvfp4; do
    timed 75 ag_wire_${format}_g$n $bench all_gather $(groups "$n") -b 64M -e 1G -f 4 -n 20 -w 5 -c 0 \
      --format "$format" \
      --json "$work/ag_wire_${format}_g$n.json"
  done
  timed 120 rs_fp32_g$n $bench reduce_scatter $(groups "$n") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d float \
    -o sum --json "$work/rs_fp32_g$n.json"
fi
if wants peer; then
  timed 150 fsdp2_g$n python3 bench/peers/fsdp2_allgather_peer.py -N "$n" -b 1M -e 4G -f 2 -n 20 -w 5 \
    --json "$work/fsdp2_g$n.json"
fi
if wants overlap; then
  timed 150 overlap_g$n $launch $bin/gtp-overlap-bench --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --wires bf16,fp8,mxfp8,nvfp4 --priorities high --depths 1,2 --json "$work/overlap_g$n.json"
fi
if wants train; then
  timed 200 train_gpt_g$n python3 bindings/python/examples/train_gpt.py --ranks "$n" --backend cuda --steps 50 \
    --reshard-to "$half" --reshard-steps 10 --json "$work/train_gpt_g$n.json"
fi
if wants pairs; then  # one process driving two GPUs (the tests' own two-rank setups)
  for t in cuda_fill_tags_test cuda_failure_test cuda_backend_test nccl_test; do
    if [ ! -x "$bin/$t" ]; then echo "== $t: not in $bin (run tools/stage-gpu.sh)"; continue; fi
    timed 90 "${t}_pair" env CUDA_VISIBLE_DEVICES=0,1 "$bin/$t"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$work/${t}_pair.log" | head -n 4
  done
  timed 60 fill_tag_cuda_bench_pair env CUDA_VISIBLE_DEVICES=0,1 "$bin/fill_tag_cuda_bench"
  grep -E '^\{' "$work/fill_tag_cuda_bench_pair.log"
fi
if wants extras; then
  timed 120 train_gpt_fill_graphs_g$n python3 bindings/python/examples/train_gpt.py --ranks "$n" --backend cuda \
    --steps 20 --wires bf16,fp8 --fill-graphs 256 --json "$work/train_gpt_fill_graphs_g$n.json"
  timed 120 overlap_mb4_g$n $launch $bin/gtp-overlap-bench --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --microbatches 4 --wires bf16,nvfp4 --priorities high --depths 1,2 --json "$work/overlap_mb4_g$n.json"
  # The configuration that reaches the targets on one GPU: keep_gathered, re-packed every step.
  timed 120 overlap_mb4_keep_g$n $launch $bin/gtp-overlap-bench --bootstrap ucx --m "${GTP_OVERLAP_M:-auto}" \
    --microbatches 4 --wires bf16,nvfp4 --priorities high --depths 2 --repack on --keep-gathered on \
    --json "$work/overlap_mb4_keep_g$n.json"
  if [ "$n" -ge 4 ]; then
    timed 90 ag_bf16_g$half $bench all_gather $(groups "$half") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d bfloat16 \
      --json "$work/ag_bf16_g$half.json"
    timed 100 rs_fp32_g$half $bench reduce_scatter $(groups "$half") -b 1M -e 4G -f 2 -n 20 -w 5 -c 0 -d float \
      -o sum \
      --json "$work/rs_fp32_g$half.json"
  fi
  for format in fp8 mxfp8 nvfp4; do
    timed 60 check_wire_${format}_g$n $bench all_gather $(groups "$n") -b 4M -e 16M -f 4 -n 2 -w 1 -c 1 \
      --format "$format"
    grep -E "^\[0\] .*gtp_wire" "$work/check_wire_${format}_g$n.log" | head -n 2
  done
fi

python3 bench/multi_gpu_summary.py "$work"
if [ ${#skipped[@]} -gt 0 ]; then
  echo "== skipped for the deadline: ${skipped[*]} (run them with a second call: bash bench/multi_gpu_h200.sh STEP)"
fi

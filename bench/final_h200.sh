#!/usr/bin/env bash
# The whole GPU-machine check in one call, most important first, every log kept: correctness
# (kernel tests, compute-sanitizer, comm/remat/cluster GPU tests), the live topology probe, the
# kernel benchmark and its torch.compile peer, the remat host-overhead benchmark, the collectives
# (bench/collectives/run_gpu.sh), then the overlap benchmark (gtp-overlap-bench).
# Everything lands in $OUT/h200_results.tgz (the device tool returns at most 8 files).
set -uo pipefail
source bench/gpu_env.sh
out=${OUT:-/tmp/gtp-out}
work=$(mktemp -d)
trap 'tar czf "$out/h200_results.tgz" -C "$work" .' EXIT
export OUT=$work
bash bench/check_h200.sh
bin=.carry/bin
for t in cluster_setup_test; do  # the remat GPU tests run in check_h200.sh
  extra=(); [ $t = cluster_setup_test ] && extra=("$bin/gtp-launch" "$bin/cluster_setup_worker")
  "$bin/$t" "${extra[@]}" --gtest_brief=1 > "$work/$t.log" 2>&1
  echo "== $t exit $? :: $(grep -E 'PASSED|FAILED|SKIPPED \]' "$work/$t.log" | tr '\n' ' ')"
done
bash bench/run_h200.sh topology > "$work/topology.log" 2>&1; echo "== topology probe: $(grep -c . "$work/topology.log") lines"
{ $bin/gtp-kernel-bench --json "$work/kernel_bench.json"
  PYTHONUNBUFFERED=1 python3 bench/peers/torch_quant_peer.py --json "$work/torch_peer.json" 2>&1 | grep -v Warning
} > "$work/kernels.log" 2>&1
grep -E "^(fp8|mxfp8|nvfp4_1d|nvfp4_2d|bf16|-) .* (64|256) " "$work/kernels.log" | grep -v "  4 \|  16 "
bash bench/run_h200.sh remat > "$work/remat.log" 2>&1
grep -E "^BM_Cuda" "$work/remat.log" | head -12
bash bench/run_h200.sh comm > "$work/comm.log" 2>&1
grep -E "^\[0\] .*(gtp_wire|#wrong|nccl )|^==" "$work/comm.log" | grep -E "gtp_wire|==" | head -40
bash bench/run_h200.sh overlap > "$work/overlap.log" 2>&1
grep -E "^(resident|gtp|sizes|rates|auto-size|one rank|gtp-overlap-bench exit)" "$work/overlap.log"

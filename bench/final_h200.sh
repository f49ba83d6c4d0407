#!/usr/bin/env bash
# The whole GPU-machine check in one call, most important first, every log kept, each step under a
# time limit: the GPU tests (bench/check_h200.sh tests: kernel, remat, C ABI and comm), the kernel
# benchmark, the overlap benchmark, compute-sanitizer (bench/check_h200.sh sanitizers), the Python
# package on the GPU (bindings/python/gpu_h200.sh), the torch.compile peer, the remat host-overhead
# benchmark, the collectives and live cluster setup (bench/collectives/run_gpu.sh) and the live
# topology probe. Binaries come from tools/stage-gpu.sh (.carry/). Everything lands in
# $OUT/h200_results.tgz (the device tool returns at most 8 files). Set GTP_COMMIT to record the
# commit in the JSON.
# GTP_DEADLINE (seconds, default 530): steps that would run past it are cut or skipped, so the
# results always come back within one device call.
# GTP_STEPS (default all): a comma-separated subset, in this file's order, of
# tests,kernels,overlap,sanitizers,python,torch_peer,remat,comm,topology.
set -uo pipefail
source bench/gpu_env.sh
export GTP_DEADLINE_EPOCH=$(( $(date +%s) + ${GTP_DEADLINE:-530} ))
out=${OUT:-/tmp/gtp-out}
work=$(mktemp -d)
trap 'tar czf "$out/h200_results.tgz" -C "$work" .' EXIT
export OUT=$work
bin=.carry/bin
timed() {  # timed LIMIT NAME COMMAND...: output to NAME.log, one line with the exit code and seconds
  local limit=$1 name=$2; shift 2
  local start=$SECONDS left=$((GTP_DEADLINE_EPOCH - $(date +%s)))
  if [ "$left" -lt 15 ]; then echo "== $name: skipped, the call's deadline is near"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  echo "== $name exit $? ($((SECONDS - start)) s)"
}
steps=",${GTP_STEPS:-all},"
wanted() { [ "$steps" = ",all," ] || [[ "$steps" == *",$1,"* ]]; }
if wanted tests; then GTP_STEP_LIMIT=120 bash bench/check_h200.sh tests; fi
if wanted kernels; then
  timed 120 kernels $bin/gtp-kernel-bench --json "$work/kernel_bench.json"
  grep -E "^(fp8|mxfp8|nvfp4_1d|nvfp4_2d|bf16|-) .* (64|256) " "$work/kernels.log"
fi
if wanted overlap; then
  timed 240 overlap bash bench/run_h200.sh overlap
  grep -E "^(resident|gtp|sizes|rates|auto-size|one rank|gtp-overlap-bench exit)" "$work/overlap.log" | head -60
fi
if wanted sanitizers; then GTP_STEP_LIMIT=90 bash bench/check_h200.sh sanitizers; fi
if wanted python && [ -f bindings/python/gpu_h200.sh ]; then
  timed 240 python bash bindings/python/gpu_h200.sh
  tail -n 30 "$work/python.log"
fi
if wanted torch_peer; then
  timed 180 torch_peer env PYTHONUNBUFFERED=1 python3 bench/peers/torch_quant_peer.py --json "$work/torch_peer.json"
  grep -v Warning "$work/torch_peer.log" | tail -n 30
fi
if wanted remat; then
  timed 240 remat bash bench/run_h200.sh remat
  grep -E "^BM_C" "$work/remat.log" | head -80
fi
if wanted comm; then
  timed 300 comm bash bench/run_h200.sh comm
  grep -E "^\[0\] .*(gtp_wire|#wrong|nccl )|^==" "$work/comm.log" | grep -E "gtp_wire|==" | head -40
fi
if wanted topology; then timed 60 topology bash bench/run_h200.sh topology; fi

#!/usr/bin/env bash
# Real NCCL peers on ONE GPU (docs/real-peers.md), on the GPU machine: every G > 1 device path with G
# processes that are real NCCL ranks sharing the GPU (gtp-launch --share-gpu / gtp.shared_gpu), and
# libgtp against Megatron-Core's own GTP. Correctness and counts only: the ranks are time-sliced and
# talk over loopback sockets, so no timing here means anything.
#   tools/gpu/run.sh peers                      (the runner's step: every step below, most important first)
#   GTP_PEERS_STEPS="h2h_g2 failure" tools/gpu/run.sh peers     (some of them)
# Steps (G = 2 and 4 where a step says gN):
#   h2h_g2 h2h_g4      bench/megatron/head_to_head.py: libgtp vs Megatron's GTP vs GTP off, NCCL counts
#   h2h_g4_ring        the same at G = 4 with NCCL_ALGO=Ring for both (one reduction order)
#   runtime_g2 runtime_g4 runtime_g8   tests/real_peers:real_peers_runtime_test at that G
#   failure            tests/real_peers:real_peers_failure_test (killed, stopped peers; divergence)
#   diverge            failure_worker's divergence scenario alone, its ranks' lines printed
#   train_g2 train_g4  train_gpt.py --share-gpu: gtp.torch on every wire against GTP off
#   te                 bindings/python/tests/test_real_peers_te.py: TE's layers at G = 2 and 4
#   memcheck           compute-sanitizer memcheck on every process of the runtime worker (G = 2, one case)
# Runs inside the runner's environment (tools/gpu/run.sh: BIN, the staged binaries; PYTHONPATH with
# TransformerEngine and Megatron-Core; NCCL_NVLS_ENABLE=0). GTP_DEADLINE (s, default 520) bounds it:
# a step that would run past it is skipped and named. Everything lands in $OUT: real_peers.json (per
# step: exit status, seconds), the JSONs of the Python steps, and real_peers_logs.tgz (every log and
# the gtest JSONs).
set -uo pipefail
if [ -z "${BIN:-}" ] || [ ! -x "${BIN}/gtp-launch" ]; then
  echo "real_peers.sh: run it as the runner's step (tools/gpu/run.sh peers), which stages and sets BIN" >&2
  exit 2
fi
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
work=$(mktemp -d)
deadline=$(( $(date +%s) + ${GTP_DEADLINE:-520} ))
bin=$BIN
all_steps="h2h_g2 runtime_g2 failure diverge te train_g2 runtime_g4 h2h_g4 h2h_g4_ring train_g4 memcheck runtime_g8"
steps=${GTP_PEERS_STEPS:-$all_steps}
for s in $steps; do
  case " $all_steps " in *" $s "*) ;; *) echo "real_peers.sh: unknown step '$s'; steps: $all_steps" >&2; exit 2 ;; esac
done
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "== real peers on one GPU: $card, commit ${GTP_COMMIT:-unknown}, steps: $steps"

results=()
timed() {  # timed LIMIT NAME COMMAND...: NAME.log in $work, one result line
  local limit=$1 name=$2; shift 2
  local left=$((deadline - $(date +%s))) start=$SECONDS status
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped, the call's deadline is near"
    results+=("{\"step\": \"$name\", \"status\": \"skipped for the deadline\"}")
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout -k 10 "$limit" "$@" > "$work/$name.log" 2>&1
  status=$?
  echo "== $name exit $status ($((SECONDS - start)) s)"
  [ "$status" -ne 0 ] && grep -v -i warn "$work/$name.log" | tail -n 25
  results+=("{\"step\": \"$name\", \"exit\": $status, \"seconds\": $((SECONDS - start))}")
}

for step in $steps; do
  case $step in
    h2h_g4_ring)  # the summation-order question: both on NCCL's ring algorithm
      timed 300 "$step" env NCCL_ALGO=Ring python3 bench/megatron/head_to_head.py --world 4 --steps 8 --variants gpt \
        --json "$out/h2h_g4_ring.json" --commit "${GTP_COMMIT:-unknown}"
      grep -E "^gpt rank" "$work/$step.log" ;;
    h2h_g2 | h2h_g4)
      g=${step#h2h_g}
      timed 420 "$step" python3 bench/megatron/head_to_head.py --world "$g" --steps 8 --variants gpt,fused \
        --json "$out/h2h_g$g.json" --commit "${GTP_COMMIT:-unknown}"
      grep -E "^(gpt|fused) rank" "$work/$step.log" ;;
    runtime_g2 | runtime_g4 | runtime_g8)
      g=${step#runtime_g}
      timed 400 "$step" env GTP_REAL_PEERS_SIZES="$g" "$bin/real_peers_runtime_test" "$bin/gtp-launch" "$bin/runtime_worker" \
        --gtest_output="json:$work/$step.gtest.json"
      grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]" "$work/$step.log" | tail -n 4 ;;
    diverge)
      timed 120 diverge env NCCL_DEBUG=WARN "$bin/gtp-launch" --share-gpu -n 2 --timeout 100 -- "$bin/failure_worker" diverge
      grep -E "rank [0-9]+:" "$work/diverge.log" ;;
    failure)
      timed 300 failure "$bin/real_peers_failure_test" "$bin/gtp-launch" "$bin/failure_worker" \
        --gtest_output="json:$work/failure.gtest.json"
      grep -E "^\[ +(OK|FAILED) +\]" "$work/failure.log" ;;
    train_g2 | train_g4)
      g=${step#train_g}
      timed 300 "$step" python3 bindings/python/examples/train_gpt.py --ranks "$g" --backend cuda --share-gpu \
        --steps 20 --wires bf16,fp8,mxfp8,nvfp4 --json "$out/train_gpt_shared_g$g.json"
      grep -E '"parity_ok"|"loss_decreased"' "$work/$step.log" ;;
    te)
      timed 400 te python3 -m pytest -q -p no:cacheprovider -s bindings/python/tests/test_real_peers_te.py \
        --junitxml="$work/te.junit.xml"
      grep -E "passed|failed|G = " "$work/te.log" | tail -n 4 ;;
    memcheck)
      # API errors not reported: NCCL probes kernels without an sm_90 image (cudaFuncGetAttributes).
      timed 400 memcheck "$bin/gtp-launch" --share-gpu -n 2 --timeout 380 -- compute-sanitizer --tool memcheck \
        --report-api-errors no --error-exitcode 9 "$bin/runtime_worker" --gtest_filter=RealPeersRuntime.KeepGatheredMatchesTheHostBackend
      grep -E "ERROR SUMMARY|PASSED|FAILED" "$work/memcheck.log" ;;
  esac
done

python3 - "$out/real_peers.json" "$card" "${GTP_COMMIT:-unknown}" "$steps" "${results[@]}" <<'PY'
import json, sys
path, card, commit, chosen, *steps = sys.argv[1:]
json.dump({"what": "real NCCL peers sharing one GPU (bench/peers/real_peers.sh); correctness only, no timing",
           "card": card, "commit": commit, "command": f'GTP_PEERS_STEPS="{chosen}" tools/gpu/run.sh peers',
           "steps": [json.loads(s) for s in steps]}, open(path, "w"), indent=1)
PY
tar czf "$out/real_peers_logs.tgz" -C "$work" .

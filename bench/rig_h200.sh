#!/usr/bin/env bash
# The one-GPU rig on the GPU machine (issue 23): G = 2, 4, 8 ranks as threads on one GPU through the
# rig (a test double for NCCL, remat/one_gpu_rig.h). Cheapest and most diagnostic first, every step
# under a time limit and the whole call under GTP_DEADLINE (seconds, default 360):
#   probe                           gtp-graph-launch-probe: ranks waiting for each other from CUDA
#                                   graphs, by launch pattern (stalls are bounded and counted)
#   smoke_kernels, smoke_memops     one_gpu_rig_test at G = 2 only, the rig's two flag modes
#   rig_test, rig_runtime_test      the rig's collectives; every multi-rank runtime path bit-compared
#                                   with the host backend (kernel flags: every wait bounded)
#   rig_diverge                     ranks that disagree between rig peers (issue 21), the eager cases
#                                   at G = 2, 4 (kernel flags); every rank must report the divergence
#   overlap_rig                     gtp-overlap-bench-rig: reduce-scatter exposure in backward, the
#                                   current grad_buffer order against the old one (rs-wait), one run
#   fill_tag_rig                    fill_tag_rig_bench: host time per call at G = 1, 2, 4 (eager fills,
#                                   one rig all-gather; the fill-graph launches in fill_tag_rig_graphs,
#                                   after the eager steps, a stall bounded by the rig's 30 s spin
#                                   timeout). A test transport's figures, not NCCL's
#   rig_runtime_host                the runtime test's eager cases at G = 2, 4, 8 with host-rendezvous
#                                   flags (GTP_RIG_FLAGS=host: what the sanitizer steps use)
#   rig_diverge_host                the divergence test's eager cases, host-rendezvous flags
#   *_memcheck                      the tests under compute-sanitizer memcheck (API errors reported:
#                                   no NCCL in these binaries), host-rendezvous flags, eager cases
#                                   (compute-sanitizer runs kernels one at a time: spinning flags
#                                   deadlock there, and host-rendezvous collectives cannot be captured)
#   rig_runtime_memops              the runtime test at G = 4 with stream-memory-operation flags
#   *_racecheck, *_synccheck        the runtime test's eager cases at G = 2, host-rendezvous flags
#   rig_diverge_graphs_g2, _g4      the divergence test's fill-graph case, each G in its own process
# GTP_RIG_STEPS=REGEX runs only the steps whose names match it (e.g. 'probe|rig_runtime_test').
# Output is line-buffered (stdbuf) so a killed step still leaves its log; a hung rig ends with the
# watchdog's report (which rank, which communicator, issued / completed) after GTP_RIG_WATCHDOG_S.
# Binaries from tools/stage-gpu.sh (.carry/bin). Logs and the JSONs land in $OUT/rig_results.tgz; one
# summary line per step on stdout. Set GTP_COMMIT to record the commit in the JSON, and GTP_RIG_STEPS
# to an extended regular expression to run only the steps whose names match (e.g. 'diverge|fill_tag').
set -uo pipefail
source bench/gpu_env.sh
# The rig sets both itself before CUDA starts; exported here too so that the logs say so.
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER
export GTP_RIG_WATCHDOG_S=${GTP_RIG_WATCHDOG_S:-60}
bin=.carry/bin
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'tar czf "$out/rig_results.tgz" -C "$work" .' EXIT
deadline=$(( $(date +%s) + ${GTP_DEADLINE:-360} ))
step() {  # step LIMIT NAME COMMAND...: log to NAME.log, one verdict line
  local limit=$1 name=$2; shift 2
  # GTP_RIG_STEPS=REGEX: only the steps whose names match (unset: every step).
  if [ -n "${GTP_RIG_STEPS:-}" ] && ! [[ $name =~ $GTP_RIG_STEPS ]]; then return; fi
  local start=$SECONDS left=$((deadline - $(date +%s)))
  if [ "$left" -lt 15 ]; then echo "== $name: skipped, the call's deadline is near"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout -k 5 "$limit" stdbuf -oL -eL "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "== $name exit $rc ($((SECONDS - start)) s) :: $(grep -E '\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|\[  FAILED  \] [A-Z].*\(|ERROR SUMMARY|RACECHECK SUMMARY|flags by|one-GPU rig|^rank [0-9]' "$work/$name.log" | sort | uniq -c | head -30 | tr '\n' ' ' | cut -c1-900)"
  if [ "$rc" != 0 ]; then echo "   last lines:"; tail -n 6 "$work/$name.log" | sed 's/^/   | /'; fi
}
for b in one_gpu_rig_test one_gpu_rig_runtime_test one_gpu_rig_diverge_test gtp-overlap-bench-rig fill_tag_rig_bench \
  gtp-graph-launch-probe; do
  [ -x "$bin/$b" ] || echo "== $b: not in $bin (run tools/stage-gpu.sh)"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
step 60 probe $bin/gtp-graph-launch-probe --ranks 2,4,8 --repeats 3 --fills 16 --timeout-ms 2000
grep -E "^(pattern|eager|record|prebuilt|two-branch)" "$work/probe.log" 2>/dev/null
step 45 smoke_kernels env GTP_RIG_FLAGS=kernels $bin/one_gpu_rig_test --gtest_filter='*G1:*G2'
step 45 smoke_memops env GTP_RIG_FLAGS=memops $bin/one_gpu_rig_test --gtest_filter='*G1:*G2'
step 90 rig_test $bin/one_gpu_rig_test
step 150 rig_runtime_test $bin/one_gpu_rig_runtime_test
step 90 rig_diverge $bin/one_gpu_rig_diverge_test --gtest_filter='-*FillGraph*'
step 90 overlap_rig $bin/gtp-overlap-bench-rig --ranks 4 --m 2048 --n 4096 --k 4096 --layers 8 --wires bf16,fp8 \
  --depths 1 --iters 10 --warmup 3 --json "$work/overlap_rig_bench.json"
grep -E "^(rs-wait|current|rig flags|gtp-overlap-bench-rig)" "$work/overlap_rig.log" 2>/dev/null
step 120 fill_tag_rig $bin/fill_tag_rig_bench --cases rig_gather,eager --json "$work/fill_tag_rig_bench.json"
grep -E "FAILED:|not run|NOT all" "$work/fill_tag_rig.log" 2>/dev/null | cut -c1-400
sed -n '/^host us per call/,$p' "$work/fill_tag_rig.log" 2>/dev/null
eager='*EveryWire*:*UndefinedGrads*:*KeepGathered*'
step 90 rig_runtime_host env GTP_RIG_FLAGS=host $bin/one_gpu_rig_runtime_test --gtest_filter="$eager"
step 90 rig_diverge_host env GTP_RIG_FLAGS=host $bin/one_gpu_rig_diverge_test --gtest_filter='-*FillGraph*'
step 120 rig_test_memcheck env GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/one_gpu_rig_test --gtest_filter='*MatchTheirDefinitions*:*Interleave*'
step 150 rig_runtime_memcheck env GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/one_gpu_rig_runtime_test --gtest_filter="${eager//\*:/*G2:}*G2:*EveryWire*G4"
step 150 rig_diverge_memcheck env GTP_RIG_FLAGS=host compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/one_gpu_rig_diverge_test --gtest_filter='*G2:*AnotherWeight*G4-*FillGraph*'
step 90 rig_runtime_memops env GTP_RIG_FLAGS=memops $bin/one_gpu_rig_runtime_test --gtest_filter='*G4'
for tool in racecheck synccheck; do
  step 90 "rig_runtime_$tool" env GTP_RIG_FLAGS=host compute-sanitizer --tool $tool --error-exitcode 9 \
    $bin/one_gpu_rig_runtime_test --gtest_filter='*EveryWire*G2:*KeepGathered*G2'
done
step 60 overlap_rig_g8 $bin/gtp-overlap-bench-rig --ranks 8 --m 1024 --n 4096 --k 4096 --layers 8 --wires bf16 \
  --depths 1 --iters 10 --warmup 3 --json "$work/overlap_rig_bench_g8.json"
grep -E "^(rs-wait|current)" "$work/overlap_rig_g8.log" 2>/dev/null
for g in 2 4; do  # each G in its own process: a stall's trap would fail every later case in one
  step 60 "rig_diverge_graphs_g$g" $bin/one_gpu_rig_diverge_test --gtest_filter="*FillGraph*G$g"
done
step 120 fill_tag_rig_graphs $bin/fill_tag_rig_bench --cases fill_graph --json "$work/fill_tag_rig_bench_graphs.json"
grep -E "FAILED:|not run|NOT all" "$work/fill_tag_rig_graphs.log" 2>/dev/null | cut -c1-400
sed -n '/^host us per call/,$p' "$work/fill_tag_rig_graphs.log" 2>/dev/null

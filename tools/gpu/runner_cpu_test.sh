#!/usr/bin/env bash
# tools/gpu/run.sh ($1) without a GPU: `list` names every step, unknown steps and bad limits exit 2
# naming the known ones, the dry run prints each step's commands, nothing staged exits 2; with the
# fake steps ($2, a test double) and a fake nvidia-smi ($3): every status (passed, failed, timed_out,
# refused, missing, skipped), the deadline's skip and cut, the archive unpacked once, the results
# JSON and the logs archive; the real multi-GPU steps refuse below 2 GPUs; and the grid profiles
# `grid-profile` writes are accepted by gtp-bench ($5, launched by $4 on 4 host ranks).
set -uo pipefail
runner=$1 fake_steps=$(realpath "$2") fake_smi=$(realpath "$3") launcher=$4 gtp_bench=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR=$tmp PATH="$tmp/smi:$PATH"
mkdir -p "$tmp/smi" && cp "$fake_smi" "$tmp/smi/nvidia-smi"
unset GTP_COMMIT GTP_DEADLINE GTP_RUNNER_DRY_RUN GTP_RUNNER_STEPS CUDA_VISIBLE_DEVICES
fail() { echo "FAIL: $*" >&2; exit 1; }

expect() {  # expect STATUS NEEDLE COMMAND...: COMMAND exits STATUS and says NEEDLE
  local want=$1 needle=$2
  shift 2
  "$@" > "$tmp/out.txt" 2>&1
  local status=$?
  [ "$status" -eq "$want" ] || fail "$* exited $status, expected $want: $(cat "$tmp/out.txt")"
  grep -q -- "$needle" "$tmp/out.txt" || fail "$* did not say '$needle': $(cat "$tmp/out.txt")"
}

# The real steps: list names every step_ function of steps.sh (run.sh refuses a table that differs).
expect 0 "alias multi_gpu" bash "$runner" list
steps=$(bash -c '. "$1"; declare -F' _ "$(dirname "$runner")/steps.sh" | awk '$3 ~ /^step_/ { print substr($3, 6) }')
[ "$(wc -l <<< "$steps")" -ge 20 ] || fail "steps.sh defines only: $steps"
for s in $steps peers h2h tests megatron te_stack rig; do
  grep -qE "^$s +[0-9]+s " "$tmp/out.txt" || fail "list does not print step $s: $(cat "$tmp/out.txt")"
done
expect 2 "unknown step 'nosuch'; known steps: tests sanitizers" bash "$runner" tests nosuch
grep -q "megatron" "$tmp/out.txt" || fail "the unknown-step message does not name megatron"
expect 2 "must be a whole number of seconds, e.g. tests:300" bash "$runner" tests:abc
expect 2 "usage" bash "$runner"
expect 2 "usage" bash "$runner" grid-profile 4

# The dry run: what each step would run, aliases expanded, nothing staged or run.
expect 0 "== mg_summary (limit 60 s" env GTP_RUNNER_DRY_RUN=1 bash "$runner" final multi_gpu peers h2h:100
for needle in "== tests (limit 420 s, needs -)" "cuda_kernels_test" "compute-sanitizer --tool memcheck" \
              "real_peers_failure_test" "== h2h (limit 100 s, needs mcore)" "head_to_head.py --json" \
              "multi_gpu_summary.py"; do
  grep -qF -- "$needle" "$tmp/out.txt" || fail "the dry run does not say '$needle': $(cat "$tmp/out.txt")"
done
[ "$(grep -c '^== ' "$tmp/out.txt")" -eq 18 ] || fail "final + multi_gpu + peers + h2h is not 18 steps: $(grep '^== ' "$tmp/out.txt")"

# Nothing staged.
expect 2 "run tools/gpu/stage.sh" env GTP_GPU_TARBALL="$tmp/none.tar.xz" GTP_GPU_DIR="$tmp/none" bash "$runner" tests

# Fake steps from an archive: every status; the archive unpacked once.
mkdir -p "$tmp/pack/bin" && echo abc1234 > "$tmp/pack/COMMIT"
tar cJf "$tmp/gpu.tar.xz" -C "$tmp/pack" .
fake() {  # fake OUT_FOLDER RUNNER_ARGS...
  local out=$1
  shift
  env OUT="$tmp/$out" GTP_RUNNER_STEPS="$fake_steps" GTP_GPU_TARBALL="$tmp/gpu.tar.xz" GTP_GPU_DIR="$tmp/stage" \
    bash "$runner" "$@"
}
expect 1 "== sleeps: timed_out" fake out1 ok fails sleeps refuses needs_te
touch "$tmp/stage/kept"
check_json() {  # check_json PATH PYTHON_ASSERTIONS (doc is the results)
  python3 - "$1" "$2" <<'PY' || fail "results JSON $1: $(cat "$1")"
import json, sys
doc = json.load(open(sys.argv[1]))
exec(sys.argv[2])
PY
}
check_json "$tmp/out1/gpu_run.json" '
assert doc["card"] == "NVIDIA H100 80GB HBM3", doc["card"]
assert doc["gpus"] == ["NVIDIA H100 80GB HBM3, 580.00"], doc["gpus"]
assert doc["commit"] == "abc1234", doc["commit"]
assert doc["command"].endswith("tools/gpu/run.sh ok fails sleeps refuses needs_te"), doc["command"]
states = [(s["name"], s["status"], s["exit"]) for s in doc["steps"]]
assert states == [("ok", "passed", 0), ("fails", "failed", 1), ("sleeps", "timed_out", 124),
                  ("refuses", "refused", 2), ("needs_te", "missing", 127)], states
assert [(p["name"], p["exit"]) for p in doc["steps"][1]["parts"]] == [("bad", 3), ("after", 0)]
assert doc["steps"][2]["limit_s"] == 2 and 2 <= doc["steps"][2]["seconds"] <= 4, doc["steps"][2]
assert doc["all_passed"] is False'
tar tzf "$tmp/out1/gpu_logs.tgz" > "$tmp/tgz.txt" || fail "gpu_logs.tgz does not read"
for f in ./gpu_run.json ./ok/ok.json ./ok/second.log ./fails/bad.log ./refuses/step.log ./needs_te/step.log; do
  grep -qxF "$f" "$tmp/tgz.txt" || fail "gpu_logs.tgz lacks $f: $(cat "$tmp/tgz.txt")"
done
grep -q "TransformerEngine bundle is not staged" "$tmp/out.txt" || fail "needs_te does not say TE is not staged"
grep -q "== bad exit 3" "$tmp/out.txt" || fail "no verdict line for the failing part: $(cat "$tmp/out.txt")"

# The deadline: a step with less than GTP_STEP_MIN_S left is skipped; one running past it is cut.
GTP_DEADLINE=20 GTP_STEP_MIN_S=17 GTP_COMMIT=given expect 1 "== ok: skipped, " fake out2 long ok
check_json "$tmp/out2/gpu_run.json" '
assert [(s["name"], s["status"]) for s in doc["steps"]] == [("long", "passed"), ("ok", "skipped")], doc["steps"]
assert doc["commit"] == "given" and doc["env"]["GTP_DEADLINE"] == "20", doc'
[ -e "$tmp/stage/kept" ] || fail "the same archive was unpacked again"
GTP_DEADLINE=3 GTP_STEP_MIN_S=1 expect 1 "== sleeps: timed_out" fake out3 sleeps:60
check_json "$tmp/out3/gpu_run.json" 'assert 1 <= doc["steps"][0]["limit_s"] <= 3, doc["steps"]'
expect 0 "2 passed" fake out4 twice  # an alias; a step named twice gets a folder of its own
check_json "$tmp/out4/gpu_run.json" '
assert doc["all_passed"] is True and [s["folder"] for s in doc["steps"]] == ["ok", "ok.2"], doc'

# The real multi-GPU steps refuse below 2 GPUs (the fake nvidia-smi lists one).
real() { env OUT="$tmp/$1" GTP_GPU_TARBALL="$tmp/none.tar.xz" GTP_GPU_DIR="$tmp/stage" bash "$runner" "${@:2}"; }
expect 1 "1 GPU(s) visible; the multi-GPU steps need at least 2" real out5 mg_pairs
CUDA_VISIBLE_DEVICES='' expect 1 "0 GPU(s) visible" real out6 mg_collectives
check_json "$tmp/out6/gpu_run.json" 'assert doc["steps"][0]["status"] == "refused", doc["steps"]'

# The grid profiles are accepted by gtp-bench: gtp_remat groups of 4 (TP 1) and 2 (TP 2) ranks.
for tp in 1 2; do
  bash "$runner" grid-profile 4 "$tp" "$tmp/profile_tp$tp.json" || fail "grid-profile 4 $tp"
  "$launcher" -n 4 --timeout 120 -- "$gtp_bench" all_gather --path host --profile "$tmp/profile_tp$tp.json" \
    --group gtp_remat -b 64K -e 128K -n 2 -w 1 -c 1 --json "$tmp/ag_tp$tp.json" || fail "gtp-bench with TP $tp"
  grep -q "\"group_size\": $((4 / tp))," "$tmp/ag_tp$tp.json" ||
    fail "TP $tp: group_size is not $((4 / tp)): $(head -c 600 "$tmp/ag_tp$tp.json")"
done
echo "runner: list, exit 2 on bad steps, dry run, every status, deadline skip and cut, results JSON, logs archive," \
     "multi-GPU refusal and grid profiles checked"

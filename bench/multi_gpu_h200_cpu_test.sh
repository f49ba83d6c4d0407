#!/usr/bin/env bash
# What bench/multi_gpu_h200.sh ($1) does without a GPU: fewer than 2 visible GPUs and unknown steps
# exit 2 with the reason, and the grid profiles it writes are accepted by gtp-bench ($3, launched by
# $2 on 4 host ranks) with gtp_remat groups of 4 (TP 1) and 2 (TP 2) ranks.
set -uo pipefail
script=$1 launcher=$2 gtp_bench=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

expect_exit2() {  # expect_exit2 NEEDLE COMMAND...
  local needle=$1; shift
  "$@" > "$tmp/out.txt" 2>&1
  local status=$?
  [ "$status" -eq 2 ] || fail "$* exited $status, expected 2: $(cat "$tmp/out.txt")"
  grep -q -- "$needle" "$tmp/out.txt" || fail "$* did not say '$needle': $(cat "$tmp/out.txt")"
}
expect_exit2 "0 GPU(s) visible; issue 7 needs at least 2" env CUDA_VISIBLE_DEVICES= bash "$script"
expect_exit2 "1 GPU(s) visible" env CUDA_VISIBLE_DEVICES=0 bash "$script" collectives
expect_exit2 "unknown step 'sweep'" bash "$script" sweep
expect_exit2 "usage" bash "$script" profile 4

for tp in 1 2; do
  bash "$script" profile 4 "$tp" "$tmp/profile_tp$tp.json" || fail "profile 4 $tp"
  "$launcher" -n 4 --timeout 120 -- "$gtp_bench" all_gather --path host --profile "$tmp/profile_tp$tp.json" \
    --group gtp_remat -b 64K -e 128K -n 2 -w 1 -c 1 --json "$tmp/ag_tp$tp.json" || fail "gtp-bench with TP $tp"
  want=$((4 / tp))
  grep -q "\"group_size\": $want," "$tmp/ag_tp$tp.json" ||
    fail "TP $tp: group_size is not $want: $(head -c 600 "$tmp/ag_tp$tp.json")"
done
echo "multi_gpu_h200.sh: exit 2 without GPUs, profiles accepted (gtp_remat groups of 4 and 2)"

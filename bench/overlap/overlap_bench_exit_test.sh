#!/usr/bin/env bash
# gtp-overlap-bench's exit codes and messages, without a GPU: bad flags exit 1 naming the flag and
# the fix; a valid command line with no CUDA device (hidden by CUDA_VISIBLE_DEVICES) exits 2.
set -u
bench=$1
fail() { echo "FAIL: $*"; exit 1; }

expect() {  # expect CODE PATTERN ARGS...: runs the bench, checks the exit code and a line of its output
  local code=$1 pattern=$2; shift 2
  local out rc
  out=$(CUDA_VISIBLE_DEVICES= "$bench" "$@" 2>&1); rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code; output: $out"
  grep -q -- "$pattern" <<< "$out" || fail "'$*' output lacks '$pattern': $out"
  echo "ok: '$*' -> $rc"
}

expect 0 "usage: gtp-overlap-bench" --help
expect 1 "--n 1000 is not a multiple of 32" --n 1000
expect 1 "unknown wire format \"fp16\"" --wires bf16,fp16
expect 1 "'highest' is not a stream priority" --priorities highest
expect 1 "unknown flag '--size'" --size 3
expect 2 "no CUDA device" --m 512 --layers 2 --json /dev/null
expect 2 "no CUDA device"
echo PASS

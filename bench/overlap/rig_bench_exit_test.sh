#!/usr/bin/env bash
# gtp-overlap-bench-rig's exit codes and messages, without a GPU: bad flags exit 1 naming the flag; a
# valid command line with no CUDA device (hidden by CUDA_VISIBLE_DEVICES) exits 2.
set -u
bench=$1
fail() { echo "FAIL: $*"; exit 1; }

expect() {  # expect CODE PATTERN ARGS...
  local code=$1 pattern=$2; shift 2
  local out rc
  out=$(CUDA_VISIBLE_DEVICES= "$bench" "$@" 2>&1); rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code; output: $out"
  grep -q -- "$pattern" <<< "$out" || fail "'$*' output lacks '$pattern': $out"
  echo "ok: '$*' -> $rc"
}

expect 0 "usage: gtp-overlap-bench-rig" --help
expect 1 "--ranks '9' is not a whole number in 2..8" --ranks 9
expect 1 "--ranks 'x' is not a whole number in 2..8" --ranks x
expect 1 "--ranks needs a value" --ranks
expect 1 "--rig-flags 'spin' is not auto, memops or kernels" --rig-flags spin
expect 1 "unknown flag '--size'" --size 3
expect 2 "no CUDA device" --ranks 2 --m 512 --layers 2
echo PASS

# Sourced by the benchmarks' exit tests, which set `bench` to the binary under test first.
# expect CODE PATTERN ARGS...: runs "$bench" ARGS with no CUDA device visible (so the test holds on GPU
# machines too) and fails unless it exits CODE with a line of output matching PATTERN.
fail() { echo "FAIL: $*"; exit 1; }

expect() {
  local code=$1 pattern=$2; shift 2
  local out rc
  out=$(CUDA_VISIBLE_DEVICES= "$bench" "$@" 2>&1); rc=$?
  [ "$rc" = "$code" ] || fail "'$*' exited $rc, expected $code; output: $out"
  grep -q -- "$pattern" <<< "$out" || fail "'$*' output lacks '$pattern': $out"
  echo "ok: '$*' -> $rc"
}

#!/usr/bin/env bash
# The GPU runner: on the GPU machine (H100 or H200, no Bazel), from a checkout that carries the
# archive tools/gpu/stage.sh made (.gpu/gtp-gpu.tar.xz), it unpacks once, sets the environment once
# and runs the named steps in order, each under its own time limit and all under the call's deadline.
#   tools/gpu/run.sh STEP[:SECONDS]...   steps or aliases (tools/gpu/steps.sh), e.g. `tests sanitizers megatron`
#   tools/gpu/run.sh list                every step and alias, with its limit and what it does
#   tools/gpu/run.sh grid-profile N TP PATH   the multi-GPU steps' grid profile (no GPU needed)
# Writes to $OUT (default /tmp/gtp-out) two files, after every step: gpu_run.json (the card, the
# commit, the command, per step its status, exit code, seconds and parts) and gpu_logs.tgz (every
# step's folder: its log, its parts' logs, the JSON it wrote).
# Environment: GTP_DEADLINE (seconds for the whole call, default 540; a step that would start with
# less than GTP_STEP_MIN_S = 15 left is skipped, one that would run past it is cut), GTP_COMMIT
# (default: the commit stage.sh recorded), GTP_RUNNER_DRY_RUN=1 (print what each step would run, run
# nothing), GTP_GPU_TARBALL / GTP_GPU_DIR (the archive, default .gpu/gtp-gpu.tar.xz, and where it is
# unpacked, default .gpu/unpacked: kept, so a warm machine unpacks a given archive once),
# GTP_RUNNER_STEPS (another steps file: the CPU test's fake steps). Exit: 0 every step passed,
# 1 one did not, 2 bad arguments or nothing staged.
set -uo pipefail
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cd "$(dirname "$SELF")/../.." || exit 2
ROOT=$PWD
# shellcheck source=tools/gpu/steps.sh
. "${GTP_RUNNER_STEPS:-$(dirname "$SELF")/steps.sh}"

declare -A LIMIT NEEDS WHAT ALIAS
ORDER=()
while read -r name limit needs what; do
  [ -n "$name" ] || continue
  ORDER+=("$name") LIMIT[$name]=$limit NEEDS[$name]=$needs WHAT[$name]=$what
  declare -F "step_$name" > /dev/null || { echo "run.sh: step '$name' is in STEP_TABLE but step_$name is not defined" >&2; exit 3; }
done <<< "$STEP_TABLE"
for fn in $(declare -F | awk '$3 ~ /^step_/ { print substr($3, 6) }'); do
  [ -n "${LIMIT[$fn]:-}" ] || { echo "run.sh: step_$fn is defined but '$fn' is not in STEP_TABLE" >&2; exit 3; }
done
while read -r name steps; do [ -n "$name" ] && ALIAS[$name]=$steps; done <<< "${ALIAS_TABLE:-}"

usage() {
  echo "usage: tools/gpu/run.sh STEP[:SECONDS]... | list | grid-profile N TP PATH  (known steps: ${ORDER[*]}; aliases: ${!ALIAS[*]})" >&2
  exit 2
}

# part NAME LIMIT COMMAND...: COMMAND's output to $OUT_DIR/NAME.log, under LIMIT seconds (- = until
# the step's end) and never past the step's end; one verdict line; a failure fails the step.
VERDICT='^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] [A-Z].*\(|ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)'
part() {
  local name=$1 limit=$2 start=$SECONDS rc left buffered=()
  shift 2
  left=$((STEP_END - $(date +%s) - 3))
  if [ "$left" -lt 5 ]; then
    echo "== $name: skipped, the step's time is up"
    printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$OUT_DIR/.parts.tsv"
    STEP_STATUS=1
    return 1
  fi
  if [ "$limit" = - ] || [ "$left" -lt "$limit" ]; then limit=$left; fi
  command -v stdbuf > /dev/null && buffered=(stdbuf -oL -eL)  # a killed part still leaves its log
  if command -v "$1" > /dev/null; then
    timeout -k 5 "$limit" "${buffered[@]}" "$@" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
  else
    echo "$1: not found (not staged? run tools/gpu/stage.sh)" > "$OUT_DIR/$name.log"
    rc=127
  fi
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT_DIR/.parts.tsv"
  echo "== $name exit $rc ($((SECONDS - start)) s)$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo ", cut at $limit s") ::" \
       "$(grep -E "$VERDICT" "$OUT_DIR/$name.log" | awk '!seen[$0]++' | head -n 30 | tr '\n' ' ' | cut -c1-900)"
  if [ "$rc" -ne 0 ]; then
    STEP_STATUS=1
    tail -n 8 "$OUT_DIR/$name.log" | sed 's/^/   | /'
  fi
  return "$rc"
}

# Internal: one step in its own process (its exports stay its own), started by run_step below.
if [ "${1:-}" = __step ]; then
  STEP_NAME=$2 OUT_DIR=$3 STEP_STATUS=0
  export OUT=$OUT_DIR
  "step_$STEP_NAME"
  exit "$STEP_STATUS"
fi

[ $# -gt 0 ] || usage
case $1 in
  list)
    printf '%-17s %6s  %-6s %s\n' step limit needs what
    for name in "${ORDER[@]}"; do printf '%-17s %5ss  %-6s %s\n' "$name" "${LIMIT[$name]}" "${NEEDS[$name]}" "${WHAT[$name]}"; done
    for name in "${!ALIAS[@]}"; do printf 'alias %-11s = %s\n' "$name" "${ALIAS[$name]}"; done | sort
    exit 0 ;;
  grid-profile)
    [ $# -eq 4 ] || usage
    grid_profile "$2" "$3" "$4"
    exit ;;
esac

# The steps to run, aliases expanded; every name checked before anything runs.
RUN=() RUN_LIMIT=()
for arg in "$@"; do
  name=${arg%%:*} seconds=
  [[ $arg == *:* ]] && seconds=${arg#*:}
  if [ -n "$seconds" ] && ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "run.sh: '$arg': the limit after ':' must be a whole number of seconds, e.g. $name:300" >&2
    exit 2
  fi
  if [ -n "${ALIAS[$name]:-}" ]; then
    for step in ${ALIAS[$name]}; do RUN+=("$step") RUN_LIMIT+=("${seconds:-${LIMIT[$step]}}"); done
  elif [ -n "${LIMIT[$name]:-}" ]; then
    RUN+=("$name") RUN_LIMIT+=("${seconds:-${LIMIT[$name]}}")
  else
    echo "run.sh: unknown step '$name'; known steps: ${ORDER[*]}; aliases: ${!ALIAS[*]} (tools/gpu/run.sh list)" >&2
    exit 2
  fi
done

TARBALL=${GTP_GPU_TARBALL:-.gpu/gtp-gpu.tar.xz}
STAGE=${GTP_GPU_DIR:-$ROOT/.gpu/unpacked}
BIN=$STAGE/bin LIB=$STAGE/lib
DEADLINE_S=${GTP_DEADLINE:-540}
[[ $DEADLINE_S =~ ^[0-9]+$ ]] || { echo "run.sh: GTP_DEADLINE='$DEADLINE_S' is not a number of seconds" >&2; exit 2; }

if [ "${GTP_RUNNER_DRY_RUN:-0}" = 1 ]; then
  echo "dry run: would unpack $TARBALL ($([ -f "$TARBALL" ] && du -h "$TARBALL" | cut -f1 || echo absent here)) into $STAGE," \
       "then run ${#RUN[@]} step(s) within GTP_DEADLINE=$DEADLINE_S s"
  for i in "${!RUN[@]}"; do
    name=${RUN[$i]}
    echo "== $name (limit ${RUN_LIMIT[$i]} s, needs ${NEEDS[$name]}): ${WHAT[$name]}"
    declare -f "step_$name" | sed '1,2d;$d'
  done
  exit 0
fi

# Unpack once: an archive already unpacked in $STAGE (same checksum) is not unpacked again.
start_epoch=$(date +%s)
DEADLINE=$((start_epoch + DEADLINE_S))
if [ -f "$TARBALL" ]; then
  sum=$(sha256sum < "$TARBALL" | cut -c1-64)
  if [ "$(cat "$STAGE/.archive.sha256" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$STAGE" && mkdir -p "$STAGE"
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" "$TARBALL" "$STAGE" ||
      { echo "run.sh: could not unpack $TARBALL into $STAGE" >&2; exit 2; }
    echo "$sum" > "$STAGE/.archive.sha256"
  fi
elif [ ! -d "$BIN" ]; then
  echo "run.sh: neither $TARBALL nor an unpacked $BIN: run tools/gpu/stage.sh on the development machine and" \
       "carry .gpu/gtp-gpu.tar.xz" >&2
  exit 2
fi

# The environment, once for every step.
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (the device tool's rule)
# NCCL and cuBLAS from the machine, else from pip's nvidia packages; the staged host libraries
# (hwloc, UCX, benchmark) where the image lacks them.
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
fi
if ! ldconfig -p | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
  cublas_dir=$(python3 -c 'import glob, os, nvidia
print(next((os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "libcublas.so.13"), recursive=True)), ""))' 2>/dev/null)
  [ -n "$cublas_dir" ] && export LD_LIBRARY_PATH="$cublas_dir:${LD_LIBRARY_PATH:-}"
fi
{ ldconfig -p | grep -q libucp.so.0 && ldconfig -p | grep -q libhwloc.so.15 && ldconfig -p | grep -q libbenchmark.so.1debian; } ||
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$LIB"
export GTP_LIBRARY=$BIN/libgtp.so
export PYTHONPATH=$ROOT/bindings/python:$STAGE/te/site:$STAGE/te/deps:$STAGE/mcore${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
GTP_COMMIT=${GTP_COMMIT:-$(cat "$STAGE/COMMIT" 2>/dev/null || echo unknown)}
if command -v nvidia-smi > /dev/null; then
  GTP_GPUS=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)
  GTP_CARD=$(head -n 1 <<< "$GTP_GPUS" | cut -d, -f1)
else
  GTP_GPUS="" GTP_CARD="none (nvidia-smi not found)"
fi
export BIN LIB STAGE GTP_COMMIT GTP_CARD GTP_GPUS
OUT=${OUT:-/tmp/gtp-out}
mkdir -p "$OUT"
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gtp-run.XXXXXX")
export RUN_DIR RUN_COMMAND="GTP_DEADLINE=$DEADLINE_S tools/gpu/run.sh $*"
echo "run.sh: ${#RUN[@]} step(s) on $GTP_CARD ($(grep -c . <<< "$GTP_GPUS") GPU(s)), commit $GTP_COMMIT," \
     "deadline in $((DEADLINE - $(date +%s))) s"

# gpu_run.json and gpu_logs.tgz, rewritten after every step so that a call cut short keeps the rest.
write_results() {
  python3 - "$RUN_DIR" "$OUT/gpu_run.json" <<'PY'
import json, os, sys
run_dir, path = sys.argv[1], sys.argv[2]
env = os.environ
steps = []
if os.path.exists(os.path.join(run_dir, ".steps.tsv")):
    for line in open(os.path.join(run_dir, ".steps.tsv")):
        name, folder, status, code, seconds, limit = line.rstrip("\n").split("\t")
        parts = []
        parts_path = os.path.join(run_dir, folder, ".parts.tsv")
        if os.path.exists(parts_path):
            for row in open(parts_path):
                part, part_code, part_seconds = row.rstrip("\n").split("\t")
                parts.append({"name": part, "exit": None if part_code == "skipped" else int(part_code),
                              "seconds": int(part_seconds)})
        steps.append({"name": name, "folder": folder, "status": status,
                      "exit": None if code == "-" else int(code), "seconds": int(seconds),
                      "limit_s": int(limit), "parts": parts})
doc = {"runner": "tools/gpu/run.sh", "card": env["GTP_CARD"],
       "gpus": [line.strip() for line in env["GTP_GPUS"].splitlines() if line.strip()],
       "commit": env["GTP_COMMIT"], "command": env["RUN_COMMAND"],
       "env": {k: v for k, v in sorted(env.items()) if k.startswith("GTP_") and k not in ("GTP_GPUS", "GTP_CARD")},
       "steps": steps, "all_passed": bool(steps) and all(s["status"] == "passed" for s in steps),
       "logs": "gpu_logs.tgz: one folder per step"}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
os.replace(path + ".tmp", path)
PY
  cp -f "$OUT/gpu_run.json" "$RUN_DIR/gpu_run.json"
  tar czf "$OUT/gpu_logs.tgz" -C "$RUN_DIR" .
}

# What the step needs beyond the binaries, unpacked once (kept in $STAGE for the next call).
unpack_python() {  # unpack_python te|mcore
  local want=$1
  [ "$want" = - ] && return 0
  if [ ! -d "$STAGE/te/site" ]; then
    local bundle
    bundle=$(ls "$STAGE"/wheels/te_bundle_*.tar.xz 2>/dev/null | head -n 1)
    [ -n "$bundle" ] || { echo "the TransformerEngine bundle is not staged (../shared/te-h200 was absent when tools/gpu/stage.sh ran)"; return 1; }
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" "$bundle" "$STAGE/te" || return 1
  fi
  [ "$want" = mcore ] || return 0
  if [ ! -d "$STAGE/mcore/megatron" ]; then
    python3 - "$STAGE" <<'PY' || { echo "the Megatron-Core wheel is not staged or does not unpack"; return 1; }
import glob, sys, zipfile
stage = sys.argv[1]
zipfile.ZipFile(glob.glob(f"{stage}/wheels/megatron_core-*.whl")[0]).extractall(f"{stage}/mcore")
try:
    import psutil  # noqa: F401  (Megatron-Core's torch_dist writer needs it)
except ImportError:
    zipfile.ZipFile(glob.glob(f"{stage}/wheels/psutil-*.whl")[0]).extractall(f"{stage}/mcore")
PY
  fi
}

status=0
run_step() {  # run_step NAME LIMIT
  local name=$1 limit=$2 folder=$1 start=$SECONDS left rc state n=2
  while [ -e "$RUN_DIR/$folder" ]; do folder=$name.$n; n=$((n + 1)); done  # a step named twice
  mkdir -p "$RUN_DIR/$folder"
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt "${GTP_STEP_MIN_S:-15}" ]; then
    echo "== $name: skipped, $left s left before GTP_DEADLINE"
    printf '%s\t%s\t%s\t-\t0\t%s\n' "$name" "$folder" skipped "$limit" >> "$RUN_DIR/.steps.tsv"
    status=1
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (limit $limit s): ${WHAT[$name]}"
  if ! unpack_python "${NEEDS[$name]}" > "$RUN_DIR/$folder/step.log" 2>&1; then
    rc=127
    cat "$RUN_DIR/$folder/step.log"
  else
    STEP_END=$(($(date +%s) + limit)) timeout -k 5 "$limit" bash "$SELF" __step "$name" "$RUN_DIR/$folder" 2>&1 |
      tee -a "$RUN_DIR/$folder/step.log"
    rc=${PIPESTATUS[0]}
  fi
  case $rc in
    0) state=passed ;;
    2) state=refused ;;
    124 | 137) state=timed_out ;;
    127) state=missing ;;
    *) state=failed ;;
  esac
  [ "$rc" -eq 0 ] || status=1
  echo "== $name: $state (exit $rc, $((SECONDS - start)) s)"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$folder" "$state" "$rc" "$((SECONDS - start))" "$limit" >> "$RUN_DIR/.steps.tsv"
}

for i in "${!RUN[@]}"; do
  run_step "${RUN[$i]}" "${RUN_LIMIT[$i]}"
  write_results
done
echo "run.sh: $(cut -f3 "$RUN_DIR/.steps.tsv" | sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }');" \
     "$OUT/gpu_run.json and $OUT/gpu_logs.tgz"
exit "$status"

#!/usr/bin/env bash
# Runs the Python package's pytest suite against the libgtp.so given as $1 (and gtp-launch as $2), writing JUnit XML where
# Bazel wants it (so tools/test_summary.py counts every case). The interpreter is $GTP_PYTHON (passed
# by tools/test.sh; .bazelrc forwards it), else python3; it needs numpy, pytest and torch (tools/setup.sh).
set -euo pipefail
library="$(readlink -f "$1")"
launcher="$(readlink -f "$2")"
shift 2  # the rest: which tests (pytest paths and options; default: the whole folder)
python="${GTP_PYTHON:-python3}"
if ! "$python" -c "import numpy, pytest" 2>/dev/null; then
  echo "pytest.sh: $python lacks numpy or pytest: run tools/setup.sh, then tools/test.sh (or set GTP_PYTHON" \
       "to a python3 that has them and pass --test_env=GTP_PYTHON)" >&2
  exit 1
fi
cd "$(dirname "$0")"  # runfiles copy of bindings/python (the tests import gtp from here)
export GTP_LIBRARY="$library" GTP_LAUNCH="$launcher"
# shellcheck source=../sanitizer_preload.sh
source ../sanitizer_preload.sh
preload_sanitizer_runtime "$library"
if ! python_starts_preloaded "$python"; then
  echo "pytest.sh: SKIPPED: $python crashes at start with LD_PRELOAD=$LD_PRELOAD (a sanitizer runtime that" \
       "cannot run in an uninstrumented interpreter); the suite runs in the plain and --config=asan builds"
  exit 0
fi
[ $# -gt 0 ] || set -- tests
exec "$python" -m pytest -q -p no:cacheprovider "$@" ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} \
  -o junit_family=xunit1 -rs

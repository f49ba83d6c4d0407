#!/usr/bin/env bash
# Runs a bench pytest file ($1: bench/megatron/h2h_test.py, bench/bridge/bridge_gpu_test.py) with $GTP_PYTHON (tools/test.sh sets it; .bazelrc forwards it), else
# python3; the test finds the gtp package beside it in the runfiles (bindings/python).
set -euo pipefail
python="${GTP_PYTHON:-python3}"
if ! "$python" -c "import pytest" 2>/dev/null; then
  echo "h2h_test.sh: $python lacks pytest: run tools/setup.sh (or set GTP_PYTHON)" >&2
  exit 1
fi
exec "$python" -m pytest -q -p no:cacheprovider "$1" ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} \
  -o junit_family=xunit1 -rs

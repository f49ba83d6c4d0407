#!/usr/bin/env bash
# Runs bench/multi_gpu_summary_test.py ($1, next to the summary it imports) with $GTP_PYTHON (tools/test.sh
# sets it; .bazelrc forwards it), else python3. Standard library only.
set -euo pipefail
exec "${GTP_PYTHON:-python3}" "$1" -v

#!/usr/bin/env bash
# Runs bench/model/gtp_cost_model_test.py ($1, next to the model it imports, with bench/results/ in the
# runfiles) with $GTP_PYTHON (tools/test.sh sets it; .bazelrc forwards it), else python3. Standard library only.
set -euo pipefail
exec "${GTP_PYTHON:-python3}" "$1" -v

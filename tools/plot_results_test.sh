#!/usr/bin/env bash
# Runs tools/plot_results_test.py ($1) on tools/plot_results.py ($2) and the committed bench/results
# JSON, with $GTP_PYTHON (tools/test.sh sets it; .bazelrc forwards it), else python3. It skips with the
# reason printed when that interpreter cannot import matplotlib.
set -euo pipefail
results="${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/results"
exec "${GTP_PYTHON:-python3}" "$1" "$2" "${results}"

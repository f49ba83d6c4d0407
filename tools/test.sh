#!/usr/bin/env bash
# Runs every test (bazel test //...) and prints a summary counted from the test cases' XML reports,
# ending with the skipped count and then the plain line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# The interpreter with numpy, pytest and torch (tools/setup.sh) for //bindings/python:python_test and
# //bindings:install_test; .bazelrc forwards GTP_PYTHON into the tests.
GTP_PYTHON="$(python3 -c 'import sys; print(sys.executable)')"
export GTP_PYTHON

bazel test //... "$@"
status=$?

python3 tools/test_summary.py bazel-testlogs $(bazel query 'tests(//...)' 2>/dev/null)
summary_status=$?
[ $status -eq 0 ] && status=$summary_status
exit $status

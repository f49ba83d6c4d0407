#!/usr/bin/env bash
# Runs every test (bazel test //...) and prints a summary counted from the test cases' XML reports,
# ending with the plain line "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."

bazel test //... "$@"
status=$?

python3 tools/test_summary.py bazel-testlogs $(bazel query 'tests(//...)' 2>/dev/null)
summary_status=$?
[ $status -eq 0 ] && status=$summary_status
exit $status

#!/usr/bin/env bash
# Runs every test (bazel test //...), then fuzzes each //fuzz target for its bounded time under ASan +
# UBSan (bazel test --config=fuzz, clang; docs/reliability.md), and prints a summary counted from the
# test cases' XML reports of both runs, ending with the skipped count and the plain line
# "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# The interpreter with numpy, pytest and torch (tools/setup.sh) for //bindings/python:python_test and
# //bindings:install_test; .bazelrc forwards GTP_PYTHON into the tests.
GTP_PYTHON="$(python3 -c 'import sys; print(sys.executable)')"
export GTP_PYTHON
# The Python 3.12 environment for //bindings/python:bridge_test and :megatron_training_test (tools/setup.sh makes it where pyenv has 3.12).
if [ -x .venv312/bin/python ]; then
  GTP_PYTHON312="$PWD/.venv312/bin/python"
  export GTP_PYTHON312
fi

bazel test //... "$@"
status=$?
main_logs="$(readlink -f bazel-testlogs)"

# The fuzz configuration has its own output directory, so bazel-testlogs now points there.
bazel test --config=fuzz //fuzz:all
fuzz_status=$?
fuzz_logs="$(readlink -f bazel-testlogs)"
[ $status -eq 0 ] && status=$fuzz_status

python3 tools/test_summary.py "$main_logs" $(bazel query 'tests(//...)' 2>/dev/null) \
  --testlogs "$fuzz_logs" $(bazel query 'tests(//fuzz:all)' 2>/dev/null)
summary_status=$?
[ $status -eq 0 ] && status=$summary_status
exit $status

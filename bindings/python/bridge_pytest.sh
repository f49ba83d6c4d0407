#!/usr/bin/env bash
# //bindings/python:bridge_test and :megatron_training_test: pytest.sh with the Python 3.12 environment
# tools/setup.sh makes for Megatron Bridge and megatron.training (GTP_PYTHON312, set by tools/test.sh
# when .venv312 exists). Without it the suite runs on GTP_PYTHON, where those tests skip, saying why.
set -euo pipefail
if [ -n "${GTP_PYTHON312:-}" ] && [ -x "$GTP_PYTHON312" ]; then
  export GTP_PYTHON="$GTP_PYTHON312"
fi
exec "$(dirname "$0")/pytest.sh" "$@"

#!/usr/bin/env bash
# The main job at this stage: the wire-format kernel benchmark. GPU kernels against a device copy
# when a GPU is present, else the CPU reference path (it says which). Extra flags go to the tool,
# e.g. --sizes-mib 64,256 --json results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt //bench:gtp-kernel-bench
exec bazel-bin/bench/gtp-kernel-bench "$@"

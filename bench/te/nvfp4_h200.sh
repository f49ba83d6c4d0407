#!/usr/bin/env bash
# NVFP4 at G > 1 (issue 20) on the GPU machine, logs to $OUT. Run on nvidia-h200-x2 (the G = 2 test
# needs two GPUs and skips, saying so, on one). Stage first, on the development machine:
#   bench/te/stage_te.sh && bazel build -c opt //bindings/c:gtp_cuda_test && cp -f bazel-bin/bindings/c/gtp_cuda_test .carry/bin/
# Steps: gtp_cuda_test (gtp_weight_amax on the CUDA backend against a host context), then pytest:
# test_te.py's NVFP4 cases (G = 1, unchanged: byte for byte against TE's NVFP4QuantizerRef, amax
# included) and test_te_nvfp4_g2.py (G = 2 over two GPUs). About 5 minutes.
set -uo pipefail
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
source bench/gpu_env.sh
nvidia-smi -L
if [ -x .carry/bin/gtp_cuda_test ]; then
  timeout 240 .carry/bin/gtp_cuda_test --gtest_brief=1 > "$out/gtp_cuda_test.log" 2>&1
  echo "gtp_cuda_test exit: $?"
  grep -E "PASSED|FAILED|Failure|SKIPPED" "$out/gtp_cuda_test.log" | head -n 20
else
  echo "gtp_cuda_test: not in .carry/bin, skipped (see the staging line above)"
fi
python3 -c "import tarfile, glob; tarfile.open(glob.glob('.carry/te/te_bundle_*.tar.xz')[0]).extractall('/tmp/te', filter='data')"
export PYTHONPATH=/tmp/te/site:/tmp/te/deps:$PWD/bindings/python
export GTP_LIBRARY=$PWD/.carry/bin/libgtp.so
timeout 420 python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_te.py -k nvfp4 \
  bindings/python/tests/test_te_nvfp4_g2.py > "$out/pytest_nvfp4.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)|^E  |^SKIPPED|passed|failed|skipped" "$out/pytest_nvfp4.log" | head -n 40

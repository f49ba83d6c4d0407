#!/usr/bin/env bash
# The Python package on the GPU machine (no Bazel there), run by bench/final_h200.sh: the CUDA tests of
# gtp.torch (pytest, when the machine's python3 has it) and the GPT example with GTP off and on over
# the CUDA backend on one GPU (G = 1, a real NCCL communicator). libgtp.so comes prebuilt in
# .carry/bin (tools/stage-gpu.sh); results go to $OUT.
set -uo pipefail
out=${OUT:-/tmp/gtp-out}
export GTP_LIBRARY=$PWD/.carry/bin/libgtp.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
if python3 -c 'import pytest' 2>/dev/null; then
  echo "== pytest: the gtp.torch CUDA tests (Linear, GroupedLinear, GEMM-layout tensors)"
  python3 -m pytest -q -rs bindings/python/tests/test_torch.py bindings/python/tests/test_torch_grouped.py -k cuda \
    > "$out/pytest_cuda.log" 2>&1
  echo "pytest exit: $?"
  grep -E "^(FAILED|ERROR)|^E |passed|failed" "$out/pytest_cuda.log" | head -n 40
else
  echo "== pytest: not installed for $(command -v python3), the gtp.torch CUDA test is not run"
fi
echo "== train_gpt.py: GTP off and on (the machinery at G = 1), CUDA backend, one GPU"
python3 bindings/python/examples/train_gpt.py --ranks 1 --backend cuda --steps 50 --machinery-at-g1 \
  --json "$out/train_gpt_cuda.json" 2>&1 | tail -n 25
echo "train_gpt exit: ${PIPESTATUS[0]}"

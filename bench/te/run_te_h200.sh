#!/usr/bin/env bash
# On the GPU machine (no Bazel, no network): the real TransformerEngine on libgtp. Needs, staged by
# bench/te/stage_te.sh: .carry/bin/libgtp.so (-c opt), .carry/lib (host libraries), .carry/te (the TE
# bundle of ../shared/te-h200). Runs the TE GPU tests, the gtp.torch CUDA tests, compute-sanitizer
# memcheck over TE cases of two layers (memory errors only: TE's sm_90 bundle probes kernels it
# lacks, which compute-sanitizer would count as API errors), and the TE stack benchmark; logs and JSON go to $OUT.
# GTP_TE_STEPS picks steps (default "tests,memcheck,bench"); GTP_COMMIT names the commit in the JSON.
set -uo pipefail
out=${OUT:-/tmp/gtp-out}
mkdir -p "$out"
steps=${GTP_TE_STEPS:-tests,memcheck,bench}
source bench/gpu_env.sh
python3 -c "import tarfile, glob; tarfile.open(glob.glob('.carry/te/te_bundle_*.tar.xz')[0]).extractall('/tmp/te', filter='data')"
export PYTHONPATH=/tmp/te/site:/tmp/te/deps:$PWD/bindings/python
export GTP_LIBRARY=$PWD/.carry/bin/libgtp.so
nvidia-smi -L
python3 -c "import torch, transformer_engine as te, transformer_engine.pytorch; print('torch', torch.__version__, 'TE', te.__version__)"
if [[ $steps == *tests* ]]; then
  echo "== pytest: TE layers on libgtp, gtp.torch CUDA tests, TE-protocol CPU tests"
  python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_te.py bindings/python/tests/test_te_protocol.py \
    bindings/python/tests/test_te_nvfp4_g2.py \
    > "$out/pytest_te.log" 2>&1
  echo "pytest exit: $?"
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$out/pytest_te.log" | head -n 60
  python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_torch.py \
    bindings/python/tests/test_torch_grouped.py -k cuda > "$out/pytest_cuda.log" 2>&1
  echo "pytest (gtp.torch CUDA) exit: $?"
  grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$out/pytest_cuda.log" | head -n 30
fi
if [[ $steps == *memcheck* ]]; then
  echo "== compute-sanitizer memcheck: one TE case per layer (BF16 and the FP8 wire)"
  timeout 420 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
    bindings/python/tests/test_te.py -k "test_te_layer_trains and (linear_column or grouped_linear) and not main_grad and (fp8_wire or not wire)" \
    > "$out/memcheck_te.log" 2>&1
  echo "memcheck exit: $?"
  grep -E "ERROR SUMMARY|passed|failed|Invalid|^E  " "$out/memcheck_te.log" | head -n 30
fi
if [[ $steps == *bench* ]]; then
  echo "== TE stack benchmark: 8 x te.Linear(8192, 8192), G = 1: off, off control, inert, machinery"
  python3 bench/te/te_stack_bench.py --json "$out/te_stack_bench.json" --commit "${GTP_COMMIT:-unknown}" \
    ${GTP_TE_BENCH_ARGS:-} 2>&1 | tee "$out/te_stack_bench.log" | tail -n 20
fi

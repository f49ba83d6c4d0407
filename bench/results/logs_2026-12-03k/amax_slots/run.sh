#!/usr/bin/env bash
# Per-weight amax slots: cuda_graph_test (re-packs in changing orders between replays) against the
# registry before the change (.carry/old) and after, every other GPU test, memcheck, the gtp.torch CUDA
# tests, the GPT example with every wire, and the overlap benchmark with the quantized wires.
source bench/gpu_env.sh
x=$OUT/x; mkdir -p $x
bin=.carry/bin
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if [ $left -lt 20 ]; then echo "$name skipped (deadline)" >> $x/rc.txt; return; fi
  [ $left -lt $limit ] && limit=$left
  local start=$SECONDS
  timeout $limit "$@" > $x/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - start))s" >> $x/rc.txt
}
step cuda_graph_test_old_registry 90 .carry/old/cuda_graph_test --gtest_brief=1
for t in cuda_graph_test cuda_backend_test cuda_stream_capture_test cuda_fill_graphs_test gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test; do
  step $t 90 $bin/$t --gtest_brief=1
done
step memcheck_graph 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/cuda_graph_test --gtest_brief=1 --gtest_filter='*depth1*:*depth2'
export GTP_LIBRARY=$PWD/$bin/libgtp.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
step pytest_cuda 90 python3 -m pytest -q -rs bindings/python/tests/test_torch.py bindings/python/tests/test_torch_grouped.py -k cuda
step train_gpt_cuda 120 python3 bindings/python/examples/train_gpt.py --ranks 1 --backend cuda --steps 20 --wires bf16,fp8,mxfp8,nvfp4 --json $x/train_gpt_cuda.json
step overlap_mb4_keepon_quantized 90 $bin/gtp-overlap-bench --wires fp8,nvfp4 --depths 2 --priorities high --repack on \
  --microbatches 4 --keep-gathered on --json $x/overlap_mb4_keepon_quantized.json
cd $OUT && tar czf results.tgz x && rm -rf x

#!/usr/bin/env bash
# C ABI 0.6 (GTP_GRAD_BUFFER_SEPARATE, gtp.torch's grad_buffer() on it): every GPU test of the runtime
# and the C ABI, the gtp.torch CUDA tests, the GPT example on CUDA with every wire, and the overlap
# benchmark's headline configuration at both stream priorities, grads into the main grad on and off.
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
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $x/gpu.txt 2>&1
export GTP_LIBRARY=$PWD/$bin/libgtp.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
step pytest_cuda 90 python3 -m pytest -q -rs bindings/python/tests/test_torch.py bindings/python/tests/test_torch_grouped.py -k cuda
ov() {  # ov NAME INTO
  step overlap_$1 90 $bin/gtp-overlap-bench --wires bf16 --depths 2 --priorities high,normal --repack on \
    --microbatches 4 --keep-gathered on --grads-into-main-grad $2 --json $x/overlap_$1.json
}
ov mb4_keepon_intoon_a on
ov mb4_keepon_intooff off
ov mb4_keepon_intoon_b on
step train_gpt_cuda 120 python3 bindings/python/examples/train_gpt.py --ranks 1 --backend cuda --steps 20 --wires bf16,fp8,mxfp8,nvfp4 --json $x/train_gpt_cuda.json
for t in cuda_backend_test cuda_fill_graphs_test cuda_graph_test gtp_cuda_test gtp_cuda_graph_test gtp_fp8_gemm_test; do
  step $t 90 $bin/$t --gtest_brief=1
done
step memcheck_gtp_cuda 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/gtp_cuda_test --gtest_brief=1
cd $OUT && tar czf results.tgz x && rm -rf x

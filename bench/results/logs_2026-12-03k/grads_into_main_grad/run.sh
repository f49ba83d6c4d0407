#!/usr/bin/env bash
# grads_into_main_grad (92e6831+): GPU tests, the overlap benchmark with the switch on and off alternating
# in one call, the GPT example on CUDA, memcheck. Each step has its own limit; none runs past the deadline.
source bench/gpu_env.sh
x=$OUT/x; mkdir -p $x
bin=.carry/bin
deadline=$(( $(date +%s) + ${DEADLINE_S:-570} ))
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
step cuda_backend_test 60 $bin/cuda_backend_test --gtest_brief=1
step cuda_stream_capture_test 60 $bin/cuda_stream_capture_test --gtest_brief=1
ov() {  # ov NAME MICROBATCHES KEEP INTO [WIRES]
  step overlap_$1 90 $bin/gtp-overlap-bench --wires ${5:-bf16} --depths 2 --priorities high --repack on \
    --microbatches $2 --keep-gathered $3 --grads-into-main-grad $4 --json $x/overlap_$1.json
}
ov mb4_keepon_intoon_a 4 on on
ov mb4_keepon_intooff_a 4 on off
ov mb4_keepon_intoon_b 4 on on
ov mb4_keepon_intooff_b 4 on off
ov mb1_keepon_intoon 1 on on
ov mb1_keepon_intooff 1 on off
ov mb4_keepoff_intoon 4 off on
ov mb4_keepoff_intooff 4 off off
ov mb1_keepoff_intoon 1 off on
ov mb1_keepoff_intooff 1 off off
ov mb4_keepon_intoon_q 4 on on fp8,nvfp4
ov mb4_keepon_intooff_q 4 on off fp8,nvfp4
export GTP_LIBRARY=$PWD/$bin/libgtp.so
export PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
step train_gpt_cuda 70 python3 bindings/python/examples/train_gpt.py --ranks 1 --backend cuda --steps 20 --wires bf16,fp8 --json $x/train_gpt_cuda.json
step pytest_cuda 90 python3 -m pytest -q -rs bindings/python/tests/test_torch.py bindings/python/tests/test_torch_grouped.py -k cuda
step cuda_graph_test 60 $bin/cuda_graph_test --gtest_brief=1
step gtp_cuda_test 60 $bin/gtp_cuda_test --gtest_brief=1
step gtp_cuda_graph_test 60 $bin/gtp_cuda_graph_test --gtest_brief=1
step memcheck_capture 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/cuda_stream_capture_test --gtest_brief=1
step memcheck_grads 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/cuda_backend_test --gtest_brief=1 --gtest_filter='*GradBuffer*'
cd $OUT && tar czf results.tgz x && rm -rf x

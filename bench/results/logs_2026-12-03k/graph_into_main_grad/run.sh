#!/usr/bin/env bash
# cuda_graph_test with the main grads as grad buffers (every depth, with and without fill graphs),
# under memcheck, racecheck and synccheck.
source bench/gpu_env.sh
x=$OUT/x; mkdir -p $x
bin=.carry/bin
deadline=$(( $(date +%s) + ${DEADLINE_S:-400} ))
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if [ $left -lt 20 ]; then echo "$name skipped (deadline)" >> $x/rc.txt; return; fi
  [ $left -lt $limit ] && limit=$left
  local start=$SECONDS
  timeout $limit "$@" > $x/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - start))s" >> $x/rc.txt
}
step cuda_graph_test 90 $bin/cuda_graph_test --gtest_brief=1
step memcheck_graph_into_main_grad 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $bin/cuda_graph_test --gtest_brief=1 --gtest_filter='*into_main_grad*'
step racecheck_graph 90 compute-sanitizer --tool racecheck --error-exitcode 9 $bin/cuda_graph_test --gtest_brief=1 --gtest_filter='*depth2_into_main_grad:*depth2'
step synccheck_graph 90 compute-sanitizer --tool synccheck --error-exitcode 9 $bin/cuda_graph_test --gtest_brief=1 --gtest_filter='*depth2_into_main_grad:*depth2'
cd $OUT && tar czf results.tgz x && rm -rf x

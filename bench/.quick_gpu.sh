source bench/gpu_env.sh
b=.carry/bin
$b/cuda_kernels_test --gtest_brief=1 > $OUT/test.log 2>&1; echo "test exit $?"; tail -3 $OUT/test.log
GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 $b/cuda_kernels_test --gtest_brief=1 > $OUT/memcheck.log 2>&1; echo "memcheck exit $?"
GTP_KERNEL_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 $b/cuda_kernels_test --gtest_brief=1 --gtest_filter='CudaKernels.PackAndUnpack*' > $OUT/racecheck.log 2>&1; echo "racecheck exit $?"
$b/gtp-kernel-bench --sizes-mib 64,256 --json $OUT/kernel_bench.json > $OUT/bench.log 2>&1; echo "bench exit $?"
grep -E " (64|256) " $OUT/bench.log

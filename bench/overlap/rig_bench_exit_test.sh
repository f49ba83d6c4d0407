#!/usr/bin/env bash
# gtp-overlap-bench-rig's exit codes and messages, without a GPU: bad flags exit 1 naming the flag; a
# valid command line with no CUDA device (hidden by CUDA_VISIBLE_DEVICES) exits 2.
set -u
bench=$1
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/exit_test_lib.sh"  # fail, expect

expect 0 "usage: gtp-overlap-bench-rig" --help
expect 1 "--ranks '9' is not a whole number in 2..8" --ranks 9
expect 1 "--ranks 'x' is not a whole number in 2..8" --ranks x
expect 1 "--ranks needs a value" --ranks
expect 1 "--rig-flags 'spin' is not auto, memops or kernels" --rig-flags spin
expect 1 "unknown flag '--size'" --size 3
expect 2 "no CUDA device" --ranks 2 --m 512 --layers 2
echo PASS

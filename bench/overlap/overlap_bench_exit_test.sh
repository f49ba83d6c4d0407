#!/usr/bin/env bash
# gtp-overlap-bench's exit codes and messages, without a GPU: bad flags exit 1 naming the flag and
# the fix; a valid command line with no CUDA device (hidden by CUDA_VISIBLE_DEVICES) exits 2.
set -u
bench=$1
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/exit_test_lib.sh"  # fail, expect

expect 0 "usage: gtp-overlap-bench" --help
expect 1 "--n 1000 is not a multiple of 32" --n 1000
expect 1 "unknown wire format \"fp16\"" --wires bf16,fp16
expect 1 "'highest' is not a stream priority" --priorities highest
expect 1 "unknown flag '--size'" --size 3
expect 2 "no CUDA device" --m 512 --layers 2 --json /dev/null
expect 2 "no CUDA device"
echo PASS

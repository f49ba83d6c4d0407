#!/usr/bin/env bash
# fill_tag_rig_bench's exit codes and messages, without a GPU: bad flags exit 1 naming the flag; a
# valid command line with no CUDA device (hidden by CUDA_VISIBLE_DEVICES) says it skipped, exits 0 and
# writes a JSON that says why.
set -u
bench=$1
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/exit_test_lib.sh"  # fail, expect

expect 0 "usage: fill_tag_rig_bench" --help
expect 1 "--ranks '9' is not a whole number in 1..8" --ranks 1,9
expect 1 "--steps 'x' is not a whole number" --steps x
expect 1 "--cases 'all' is not eager, fill_graph or rig_gather" --cases all
expect 1 "--rig-flags 'host' is not kernels, memops or auto" --rig-flags host
expect 1 "--json needs a value" --json
expect 1 "unknown flag --size" --size 3
json="${TEST_TMPDIR:-/tmp}/fill_tag_rig_bench.json"
expect 0 "no CUDA device" --ranks 2,4 --steps 10 --json "$json"
grep -q '"skipped": "no CUDA device' "$json" || fail "the JSON does not say it skipped: $(cat "$json")"
echo PASS

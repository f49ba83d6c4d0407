#!/usr/bin/env bash
# run_fuzz_target.sh BINARY CORPUS SECONDS: a gtp_fuzz_test (fuzz.bzl). Under --config=fuzz BINARY is a
# libFuzzer target: it runs the seeds in CORPUS, then fuzzes for SECONDS (GTP_FUZZ_SECONDS overrides);
# new inputs go to a scratch copy, a crashing input to the test's outputs (outputs.zip). In plain
# builds BINARY replays CORPUS once.
set -euo pipefail
binary="$1"
seeds="${TEST_SRCDIR}/${TEST_WORKSPACE}/$2"
seconds="${GTP_FUZZ_SECONDS:-$3}"
work="${TEST_TMPDIR}/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR}}"
mkdir -p "${work}"
# -timeout: one input taking longer is a finding (a hang). -rss_limit_mb: so is unbounded memory.
# Only the log's tail is kept (the stats, or the finding and its stack): the targets' own error
# messages fill megabytes, which Bazel's test.xml generation then takes minutes to escape.
"${binary}" -max_total_time="${seconds}" -timeout=25 -rss_limit_mb=2560 -print_final_stats=1 \
  -artifact_prefix="${artifacts}/" "${work}" "${seeds}" 2>&1 | tail -n 400

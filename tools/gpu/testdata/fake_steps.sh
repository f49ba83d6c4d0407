# A test double of tools/gpu/steps.sh for runner_cpu_test.sh (no GPU): steps that pass, fail, run past
# their limit, refuse, need the TE bundle, or take a few seconds (the deadline cases).
STEP_TABLE='
ok        30  -   two parts that pass; writes ok.json
fails     30  -   a part that exits 3, then one that passes
sleeps    2   -   sleeps past its limit
refuses   30  -   exits 2, as a multi-GPU step does on one GPU
needs_te  30  te  needs the TransformerEngine bundle, which the test does not stage
long      30  -   takes 4 s
'
ALIAS_TABLE='
twice     ok ok
'
step_ok() {
  part first 10 true
  part second - bash -c 'echo "[  PASSED  ] 1 test."'
  echo '{"x": 1}' > "$OUT_DIR/ok.json"
}
step_fails() {
  part bad 10 bash -c 'echo broken; exit 3'
  part after 10 true
}
step_sleeps() { sleep 30; }
step_refuses() { echo "refuses: wrong machine" >&2; exit 2; }
step_needs_te() { echo "needs_te ran without TE"; }
step_long() { sleep 4; }

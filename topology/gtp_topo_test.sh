#!/usr/bin/env bash
# Runs the gtp-topo binary through every verb, good and bad input, and checks exit codes and output.
set -uo pipefail

runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
topo="${runfiles}/topology/gtp-topo"
profiles="${runfiles}/docs/profiles"
repo_root="$(dirname "$(dirname "$(realpath "${runfiles}/topology/BUILD")")")"
fixtures="${repo_root}/../shared/fixtures/hwloc"
tmp="${TEST_TMPDIR}"
failures=0

# The hwloc exports of real machines live outside the repository; without them the checks that replay
# them are skipped (printed), and every other check runs.
have_fixtures=1
if [ ! -f "${fixtures}/power8gpudistances.xml" ]; then
  have_fixtures=0
  echo "SKIPPED: the checks that replay hwloc exports of real machines (probe-power8-*, probe-intel-json," \
       "validate-xml): fixtures not found at ${fixtures}; check out shared/ beside the repository as ../shared"
fi

# expect NAME CODE PATTERN -- ARGS...: runs gtp-topo ARGS, checks the exit code and that the combined
# output matches PATTERN (grep -E).
expect() {
  local name="$1" code="$2" pattern="$3"
  shift 4
  local out rc
  out="$("${topo}" "$@" 2>&1)"
  rc=$?
  if [ "${rc}" -ne "${code}" ]; then
    echo "FAIL ${name}: exit ${rc}, expected ${code}"; echo "${out}" | head -20; failures=$((failures + 1)); return
  fi
  if ! grep -Eq -- "${pattern}" <<<"${out}"; then
    echo "FAIL ${name}: output lacks /${pattern}/"; echo "${out}" | head -20; failures=$((failures + 1)); return
  fi
  echo "ok   ${name}"
}

# Valid JSON with the given python expression true on it.
expect_json() {
  local name="$1" check="$2"
  shift 2
  if "${topo}" "$@" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if (${check}) else 1)"; then
    echo "ok   ${name}"
  else
    echo "FAIL ${name}: JSON check '${check}' failed"; failures=$((failures + 1))
  fi
}

# Help and usage.
expect help-main 0 'verbs:' -- --help
expect help-probe 0 'usage: gtp-topo probe' -- probe --help
expect help-plan 0 'usage: gtp-topo plan' -- plan --help
expect help-validate 0 'usage: gtp-topo validate' -- validate --help
expect no-verb 2 'no verb given' --
expect unknown-verb 2 "unknown verb 'frobnicate'" -- frobnicate
expect probe-bad-option 2 "unknown option '--bogus'" -- probe --bogus
expect probe-missing-value 2 '--xml needs a value' -- probe --xml
expect plan-no-profile 2 'plan needs --profile FILE' -- plan
expect validate-no-file 2 'validate needs exactly one FILE' -- validate

# probe
if [ "${have_fixtures}" -eq 1 ]; then
  expect probe-power8-table 0 'GPUs: 4' -- probe --xml "${fixtures}/power8gpudistances.xml"
  expect_json probe-power8-json "d['hostname']=='drac-12.grenoble.grid5000.fr' and len(d['gpus'])==4 and d['gpus'][0]['nvlink'][0]['gbytes_per_s']==40" \
    probe --xml "${fixtures}/power8gpudistances.xml" --json
  expect_json probe-intel-json "len(d['numa_nodes'])==4 and len(d['gpus'])==0 and len(d['nics'])==8" \
    probe --xml "${fixtures}/96em64t-4n4d3ca2co-pci.xml" --json
fi
expect probe-live 0 'host ' -- probe
expect_json probe-live-json "d['source']=='live'" probe --json
expect probe-missing-xml 1 'cannot open hwloc XML file' -- probe --xml "${tmp}/nope.xml"
printf '<?xml version="1.0"?>\n<topology><object type="Machine"' > "${tmp}/broken.xml"
expect probe-malformed-xml 1 'is not a valid hwloc XML topology' -- probe --xml "${tmp}/broken.xml"
# hwloc 2.9 segfaults on a PU without complete_cpuset; gtp-topo died with SIGSEGV (exit 139) before.
sed -n '/R"(<?xml/,/^<\/topology>/p' "${runfiles}/topology/internal/crashing_hwloc_xml.h" | sed 's/^.*R"(//' > "${tmp}/crash.xml"
expect validate-xml-crashing-hwloc 1 "hwloc crashed with signal 11 .* loading '${tmp}/crash.xml'" -- validate "${tmp}/crash.xml"
expect probe-xml-crashing-hwloc 1 'hwloc crashed with signal' -- probe --xml "${tmp}/crash.xml"

# plan
expect plan-dgx 0 'violations: 0 \(0 unresolved\)' -- plan --profile "${profiles}/dgx-h100-8gpu.json"
expect plan-dgx-groups 0 'tp_gtp_remat +gtp_remat-tp +8 +1 +nvlink +450.0' -- plan --profile "${profiles}/dgx-h100-8gpu.json"
expect_json plan-nvl72-json "d['ok'] and len(d['placement'])==64 and d['groups'][11]['name']=='ep' and d['groups'][11]['worst_link']=='nvlink'" \
  plan --profile "${profiles}/gb200-nvl72.json" --json
expect plan-h200 0 'world 1 = tp 1' -- plan --profile "${profiles}/single-h200.json"
expect plan-missing-profile 1 "cannot open profile" -- plan --profile "${tmp}/nope.json"
printf '{"schema_version": 1, "cluster": ' > "${tmp}/malformed.json"
expect plan-malformed-json 1 'is not valid JSON' -- plan --profile "${tmp}/malformed.json"

python3 - "${profiles}/dgx-h100-8gpu.json" "${tmp}" <<'EOF'
import json, sys
base = json.load(open(sys.argv[1]))
def write(name, change):
    doc = json.loads(json.dumps(base))
    change(doc)
    json.dump(doc, open(sys.argv[2] + "/" + name, "w"))
write("impossible.json", lambda d: d["parallel"].update(tensor_parallel_num_weight_shards=9))
write("typo.json", lambda d: d["groups"].update(gtp_remta={}))
# tp x gtp_remat = 16 does not fit the 8-GPU NVLink domain of one DGX; two hosts make it plannable.
def too_wide(policy):
    def change(d):
        d["cluster"]["template"]["host_count"] = 2
        d["parallel"].update(tensor_model_parallel_size=4, tensor_parallel_num_weight_shards=16)
        d["placement"]["on_violation"] = policy
    return change
write("wide-fail.json", too_wide("fail"))
write("wide-warn.json", too_wide("warn"))
EOF
expect plan-impossible-sizes 1 '/parallel/tensor_parallel_num_weight_shards: tensor_parallel_num_weight_shards=9 is not divisible by tensor_model_parallel_size=2' \
  -- plan --profile "${tmp}/impossible.json"
expect plan-typo 1 "/groups/gtp_remta: unknown group 'gtp_remta': did you mean 'gtp_remat'" -- plan --profile "${tmp}/typo.json"
expect plan-violation-fail 1 'larger than the largest NVLink domain \(8 GPUs\)' -- plan --profile "${tmp}/wide-fail.json"
expect plan-violation-warn 0 'violations: 1 \(1 unresolved\)' -- plan --profile "${tmp}/wide-warn.json"

# validate
expect validate-dgx 0 'OK: schema version 1, 8 GPUs on 1 hosts' -- validate "${profiles}/dgx-h100-8gpu.json"
expect validate-nvl72 0 'OK: .*72 GPUs on 18 hosts' -- validate "${profiles}/gb200-nvl72.json"
expect validate-h200 0 'OK' -- validate "${profiles}/single-h200.json"
if [ "${have_fixtures}" -eq 1 ]; then
  expect validate-xml 0 'valid hwloc XML: host drac-12.grenoble.grid5000.fr, 2 NUMA nodes, 4 GPUs, 0 NICs' \
    -- validate "${fixtures}/power8gpudistances.xml"
fi
expect validate-missing 1 'cannot open profile' -- validate "${tmp}/nope.json"
expect validate-malformed 1 'is not valid JSON' -- validate "${tmp}/malformed.json"
python3 -c "print('[' * 100000)" > "${tmp}/deep.json"
expect validate-deep 1 'nesting deeper than 64 levels' -- validate "${tmp}/deep.json"
mkfifo "${tmp}/fifo.json"
expect validate-fifo 1 'is not a regular file' -- validate "${tmp}/fifo.json"
expect plan-dev-zero 1 'is not a regular file' -- plan --profile /dev/zero
expect validate-malformed-xml 1 'is not a valid hwloc XML topology' -- validate "${tmp}/broken.xml"
expect validate-impossible 1 'choose a multiple of 2' -- validate "${tmp}/impossible.json"
expect validate-warn-is-strict 1 'INVALID: .*1 unresolved violation' -- validate "${tmp}/wide-warn.json"

if [ "${failures}" -ne 0 ]; then
  echo "${failures} check(s) failed"
  exit 1
fi
echo "all gtp-topo checks passed"

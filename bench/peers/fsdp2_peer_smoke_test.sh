#!/usr/bin/env bash
# Runs the FSDP2 all-gather peer ($1) on 2 CPU processes over gloo and checks its JSON: every size of
# the sweep present, the gathered weight correct (wrong 0), times positive, busbw = algbw / 2.
# The interpreter is $GTP_PYTHON (tools/test.sh sets it; .bazelrc forwards it), else python3.
set -euo pipefail
python="${GTP_PYTHON:-python3}"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "fsdp2_peer_smoke_test: $python lacks torch: run tools/setup.sh, then tools/test.sh" >&2
  exit 1
fi
out="${TEST_TMPDIR:-$(mktemp -d)}/fsdp2_peer.json"
"$python" "$1" -N 2 -b 1M -e 4M -f 2 -n 3 -w 1 --device cpu --json "$out"
"$python" - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["implementation"].startswith("torch.distributed.fsdp.fully_shard"), doc["implementation"]
assert (doc["ranks"], doc["group_size"], doc["busbw_factor"], doc["path"]) == (2, 2, 0.5, "host"), doc
rows = doc["results"]
assert [r["size"] for r in rows] == [1 << 20, 2 << 20, 4 << 20], [r["size"] for r in rows]
for r in rows:
    assert r["wrong"] == 0, r
    assert r["shape"] == [r["size"] // 8192, 4096] and r["shard_shape"] == [r["size"] // 16384, 4096], r
    assert r["time_us"] > 0 and abs(r["algbw_gbps"] - r["size"] / 1e3 / r["time_us"]) < 1e-9, r
    assert abs(r["busbw_gbps"] - r["algbw_gbps"] / 2) < 1e-12, r
print("fsdp2 peer JSON ok:", [(r["size"], round(r["time_us"], 1)) for r in rows])
PY

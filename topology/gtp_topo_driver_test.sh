#!/usr/bin/env bash
# Runs `gtp-topo probe --json` against stand-in CUDA driver and NVML libraries (fake_driver.so,
# installed as libcuda.so.1 and libnvidia-ml.so.1 on LD_LIBRARY_PATH) and checks what the dlopen'ed
# paths report: CUDA ordinals and bus ids, NVLink links merged per NVSwitch, the fabric domain.
set -euo pipefail

runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
lib="${TEST_TMPDIR}/driver"
mkdir -p "${lib}"
ln -sf "${runfiles}/topology/fake_driver.so" "${lib}/libcuda.so.1"
ln -sf "${runfiles}/topology/fake_driver.so" "${lib}/libnvidia-ml.so.1"

LD_LIBRARY_PATH="${lib}" "${runfiles}/topology/gtp-topo" probe --json > "${TEST_TMPDIR}/host.json"
python3 - "${TEST_TMPDIR}/host.json" <<'PY'
import json, sys
host = json.load(open(sys.argv[1]))
gpus = host["gpus"]
assert [g["index"] for g in gpus] == [0, 1], gpus
assert [g["bus_id"] for g in gpus] == ["0000:1b:00.0", "0000:43:00.0"], gpus
for i, gpu in enumerate(gpus):
    assert gpu["model"] == "NVIDIA H100 80GB HBM3", gpu
    assert gpu["uuid"] == "GPU-fake-%d" % i, gpu
    links = {link["peer"]: link for link in gpu["nvlink"]}
    assert sorted(links) == ["0000:c4:00.0", "0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0"], links
    assert all(link["peer_kind"] == "nvswitch" for link in gpu["nvlink"]), links
    # 5, 5, 4 and 4 NVLink 4.0 links at 25 GB/s per direction: 450 GB/s in total.
    assert [links[p]["gbytes_per_s"] for p in sorted(links)] == [125, 125, 100, 100], links
    assert gpu["nvlink_domain"] == "fabric:000102030405060708090a0b0c0d0e0f/7", gpu
notes = " ".join(host["notes"])
assert "NVLink from NVML" in notes, notes
assert "is not in hwloc's PCI tree" in notes, notes  # the fake GPUs do not exist on this machine's PCI bus
print("driver path checks passed")
PY

#!/usr/bin/env bash
# Stages what bench/megatron/run_megatron_h200.sh needs in .carry/ (the device tool carries it):
# everything bench/te/stage_te.sh stages (libgtp.so -c opt, host libraries, the TE 2.20.2 bundle)
# plus the Megatron-Core 0.19.2 wheel from ../shared/te-h200 (the H200 machine has no network) and psutil.
set -euo pipefail
cd "$(dirname "$0")/../.."
bench/te/stage_te.sh
wheel=$(ls ../shared/te-h200/megatron_core-0.19.2-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "stage_megatron: ../shared/te-h200/megatron_core-0.19.2-*.whl not found: check out shared/ beside the repository" >&2; exit 1; }
mkdir -p .carry/megatron
cp "$wheel" .carry/megatron/
# Megatron-Core's torch_dist writer imports psutil, which the H200 image may lack: its abi3 wheel
# (pinned as in tools/constraints.txt), unpacked there only when `import psutil` fails.
psutil=$(grep -i '^psutil==' tools/constraints.txt | cut -d= -f3)
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: --python-version 3.12 \
  --platform manylinux2014_x86_64 "psutil==$psutil" -d .carry/megatron ||
  { echo "stage_megatron: pip could not download psutil==$psutil (the checkpoint part needs it)" >&2; exit 1; }
size=$(du -sm .carry | cut -f1)
echo "stage_megatron: .carry holds ${size} MiB (the device tool carries at most 64 MiB)"
[ "$size" -lt 64 ] || { echo "stage_megatron: .carry is over 64 MiB" >&2; exit 1; }

#!/usr/bin/env bash
# Stages what bench/te/run_te_h200.sh needs in .carry/ (the device tool carries it): libgtp.so built
# with -c opt, the host libraries it links that the GPU image may lack, and the TE bundle from
# ../shared/te-h200 (TE 2.20.2 for the H200 machine, which has no network).
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //bindings/c:libgtp.so
rm -rf .carry && mkdir -p .carry/bin .carry/lib .carry/te
cp -f bazel-bin/bindings/c/libgtp.so .carry/bin/
for lib in libhwloc.so.15 libnuma.so.1 libucm.so.0 libucp.so.0 libucs.so.0 libuct.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .carry/lib/
done
bundle=../shared/te-h200/te_bundle_sm90_cp312.tar.xz
[ -f "$bundle" ] || { echo "stage_te: $bundle not found: check out shared/ beside the repository" >&2; exit 1; }
cp "$bundle" .carry/te/
echo "stage_te: .carry holds $(du -sh .carry | cut -f1)"

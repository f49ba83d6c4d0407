#!/usr/bin/env bash
# install.sh PREFIX: installs what a framework build needs (bazel run //:install -- PREFIX):
#   PREFIX/include/gtp/gtp.h and PREFIX/include/gtp/comm/bootstrap_callbacks.h (gtp.h's
#   #include "comm/bootstrap_callbacks.h" resolves next to it), PREFIX/lib/libgtp.so,
#   PREFIX/lib/pkgconfig/gtp.pc, the CMake package PREFIX/lib/cmake/gtp/gtpConfig.cmake (+ its version
#   file; find_package(gtp CONFIG) -> gtp::gtp) and the Python package at PREFIX/lib/python/gtp
#   (finds ../../libgtp.so).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: bazel run //:install -- PREFIX" >&2
  exit 2
fi
prefix="$1"
case "$prefix" in
  /*) ;;
  *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;;  # bazel run starts in the runfiles folder
esac
# The workspace root inside the runfiles: beside $0 under bazel test, $0.runfiles/WORKSPACE under bazel run.
runfiles=""
for candidate in "$(dirname "$0")/.." "$0.runfiles"/* "${RUNFILES_DIR:-/nonexistent}"/*; do
  if [ -f "$candidate/bindings/gtp.pc.in" ]; then runfiles="$(cd "$candidate" && pwd)"; break; fi
done
[ -n "$runfiles" ] || { echo "install.sh: run it with bazel run //:install -- PREFIX" >&2; exit 1; }
header="$runfiles/bindings/c/include/gtp/gtp.h"
version="$(sed -n 's/^#define GTP_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$header" | paste -sd.)"

install -d "$prefix/include/gtp/comm" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/gtp" "$prefix/lib/python"
install -m 644 "$header" "$prefix/include/gtp/gtp.h"
install -m 644 "$runfiles/comm/bootstrap_callbacks.h" "$prefix/include/gtp/comm/bootstrap_callbacks.h"
install -m 755 "$runfiles/bindings/c/libgtp.so" "$prefix/lib/libgtp.so"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$runfiles/bindings/gtp.pc.in" > "$prefix/lib/pkgconfig/gtp.pc"
# The CMake files hold no path: gtpConfig.cmake finds the prefix from its own location.
install -m 644 "$runfiles/bindings/gtpConfig.cmake" "$prefix/lib/cmake/gtp/gtpConfig.cmake"
sed -e "s|@VERSION@|$version|" "$runfiles/bindings/gtpConfigVersion.cmake.in" \
  > "$prefix/lib/cmake/gtp/gtpConfigVersion.cmake"
rm -rf "$prefix/lib/python/gtp"
(cd "$runfiles/bindings/python" && find gtp -name '*.py' | while read -r f; do
  install -D -m 644 "$f" "$prefix/lib/python/$f"
done)
echo "installed libgtp $version into $prefix:"
echo "  C:      PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs gtp"
echo "  CMake:  find_package(gtp CONFIG REQUIRED) with -DCMAKE_PREFIX_PATH=$prefix; link gtp::gtp"
echo "  Python: PYTHONPATH=$prefix/lib/python python3 -c 'import gtp'"

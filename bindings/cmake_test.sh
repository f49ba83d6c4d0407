#!/usr/bin/env bash
# cmake_test.sh INSTALL CONSUMER_DIR: installs into a temporary prefix, moves the prefix (the CMake
# package must be relocatable), builds cmake_consumer/ with find_package(gtp CONFIG) and
# CMAKE_PREFIX_PATH, runs it on one rank, and checks which versions find_package accepts.
set -euo pipefail
install_sh="$1" consumer="$(cd "$2" && pwd)"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cmake.XXXXXX")"

if ! command -v cmake >/dev/null; then
  echo "SKIPPED: cmake is not installed (tools/setup.sh installs it; Debian package cmake)"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then  # counted as a skipped case by tools/test_summary.py
    printf '<?xml version="1.0"?>\n<testsuites><testsuite name="cmake_test" tests="1" skipped="1">'`
          `'<testcase name="cmake_test"><skipped message="cmake is not installed"/></testcase>'`
          `'</testsuite></testsuites>\n' > "$XML_OUTPUT_FILE"
  fi
  exit 0
fi
echo "$(cmake --version | head -n 1)"

"$install_sh" "$tmp/staging" >/dev/null
version="$(sed -n 's/^#define GTP_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
  "$tmp/staging/include/gtp/gtp.h" | paste -sd.)"
for f in lib/cmake/gtp/gtpConfig.cmake lib/cmake/gtp/gtpConfigVersion.cmake; do
  [ -f "$tmp/staging/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
if grep -rn "$tmp" "$tmp/staging/lib/cmake"; then
  echo "FAIL: the CMake package names the install prefix: it would break when the prefix moves"; exit 1
fi
mv "$tmp/staging" "$tmp/prefix"  # relocated: nothing may point at staging/ any more
prefix="$tmp/prefix"

cmake -S "$consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" -DGTP_WANT="$version" >"$tmp/configure.log" \
  || { cat "$tmp/configure.log"; echo "FAIL: configuring the consumer with find_package(gtp $version CONFIG)"; exit 1; }
cmake --build "$tmp/build" >"$tmp/build.log" || { cat "$tmp/build.log"; echo "FAIL: building the consumer"; exit 1; }
grep "gtp $version from $prefix/lib/cmake/gtp" "$tmp/configure.log" \
  || { cat "$tmp/configure.log"; echo "FAIL: find_package did not report gtp $version from the moved prefix"; exit 1; }
needed="$(readelf -d "$tmp/build/consumer" | sed -n 's/.*NEEDED.*\[\(.*gtp.*\)\].*/\1/p')"
[ "$needed" = "libgtp.so" ] || { echo "FAIL: the consumer needs '$needed', expected libgtp.so (no path)"; exit 1; }
# shellcheck source=sanitizer_preload.sh
source "$(dirname "$0")/sanitizer_preload.sh"
preload_sanitizer_runtime "$prefix/lib/libgtp.so"  # only for the run, not for cmake and the compiler
# No LD_LIBRARY_PATH: the build-tree RPATH CMake derives from gtp::gtp's location must find it.
"$tmp/build/consumer"
unset LD_PRELOAD

# Which versions find_package accepts: the same major.minor, not a newer patch (gtp.h's rule).
IFS=. read -r major minor patch <<<"$version"
probe() {  # probe WANT: configures version_probe/ asking for WANT; returns cmake's status
  rm -rf "$tmp/probe"
  cmake -S "$consumer/version_probe" -B "$tmp/probe" -DCMAKE_PREFIX_PATH="$prefix" "-DGTP_WANT=$1" \
    >"$tmp/probe.log" 2>&1
}
for want in "" "$major.$minor" "$version" "$version;EXACT" "$major.$minor...$major.$((minor + 1))"; do
  probe "$want" || { cat "$tmp/probe.log"; echo "FAIL: find_package(gtp $want CONFIG) refused $version"; exit 1; }
  echo "find_package(gtp ${want:-<no version>} CONFIG): accepted"
done
for want in 99 "$((major + 1)).$minor" "$major.$((minor + 1))" "$major.$minor.$((patch + 1))" \
            "$major.$((minor + 1))...$((major + 1)).0"; do
  if probe "$want"; then
    cat "$tmp/probe.log"; echo "FAIL: find_package(gtp $want CONFIG) accepted $version"; exit 1
  fi
  # Found and rejected for its version, not merely not found.
  grep -q "version: $version" "$tmp/probe.log" \
    || { cat "$tmp/probe.log"; echo "FAIL: find_package(gtp $want) failed without naming version $version"; exit 1; }
  echo "find_package(gtp $want CONFIG): refused (installed $version)"
done
if [ "$minor" -gt 0 ]; then
  probe "$major.$((minor - 1))" && { echo "FAIL: find_package(gtp $major.$((minor - 1))) accepted $version"; exit 1; }
  echo "find_package(gtp $major.$((minor - 1)) CONFIG): refused (installed $version)"
fi

# A prefix whose library is gone: the package says so instead of handing out a broken target.
rm "$prefix/lib/libgtp.so"
if probe ""; then echo "FAIL: find_package(gtp) accepted a prefix without libgtp.so"; exit 1; fi
tr -s '[:space:]' ' ' <"$tmp/probe.log" | grep -q "$prefix/lib/libgtp.so is missing" || { cat "$tmp/probe.log"; echo "FAIL: no 'missing' message"; exit 1; }
echo "a prefix without libgtp.so: refused, naming the file"
echo PASS

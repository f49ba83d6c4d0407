#!/usr/bin/env bash
# Installs into a temporary prefix with install.sh, builds install_test.c with
# `pkg-config --cflags --libs gtp`, runs it, and imports the installed Python package.
set -euo pipefail
install_sh="$1" source_c="$2"
prefix="${TEST_TMPDIR:-$(mktemp -d)}/prefix"
"$install_sh" "$prefix"
# shellcheck source=sanitizer_preload.sh
source "$(dirname "$0")/sanitizer_preload.sh"
preload_sanitizer_runtime "$prefix/lib/libgtp.so"
for f in include/gtp/gtp.h include/gtp/comm/bootstrap_callbacks.h lib/libgtp.so lib/pkgconfig/gtp.pc \
         lib/python/gtp/__init__.py lib/python/gtp/torch/linear.py; do
  [ -f "$prefix/$f" ] || { echo "FAIL: $prefix/$f was not installed"; exit 1; }
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags="$(pkg-config --cflags --libs gtp)"
echo "pkg-config --cflags --libs gtp: $flags"
[ "$(pkg-config --modversion gtp)" = "$(sed -n 's/^#define GTP_VERSION_MAJOR \([0-9]*\)$/\1/p' "$prefix/include/gtp/gtp.h").$(
  sed -n 's/^#define GTP_VERSION_MINOR \([0-9]*\)$/\1/p' "$prefix/include/gtp/gtp.h").$(
  sed -n 's/^#define GTP_VERSION_PATCH \([0-9]*\)$/\1/p' "$prefix/include/gtp/gtp.h")" ] \
  || { echo "FAIL: gtp.pc's version differs from gtp.h's"; exit 1; }
# shellcheck disable=SC2086
cc -std=c99 -Wall -Werror -o "$prefix/install_test" "$source_c" $flags
LD_LIBRARY_PATH="$prefix/lib" "$prefix/install_test"
python="${GTP_PYTHON:-python3}"
if ! python_starts_preloaded "$python"; then
  echo "SKIPPED the Python import: $python crashes at start with LD_PRELOAD=$LD_PRELOAD (a sanitizer" \
       "runtime that cannot run in an uninstrumented interpreter); it runs in the plain and --config=asan builds"
elif "$python" -c "import numpy" 2>/dev/null; then
  found="$(cd / && env -u GTP_LIBRARY PYTHONPATH="$prefix/lib/python" "$python" -c 'import gtp; print(gtp.library_path())')"
  [ "$found" = "$prefix/lib/libgtp.so" ] || { echo "FAIL: the installed package loaded $found"; exit 1; }
  echo "installed Python package finds $found"
else
  echo "FAIL: $python has no numpy; run tools/setup.sh (GTP_PYTHON names the interpreter)"
  exit 1
fi
echo PASS

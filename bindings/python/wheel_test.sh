#!/usr/bin/env bash
# wheel_test.sh DIST LIBRARY HEADER: the wheel Bazel built (//:wheel) is well-formed and reproducible,
# pip installs it into a fresh venv, and there `import gtp` / `import gtp.torch` come from the wheel
# with its bundled libgtp.so and run one rank on the host backend; pip uninstall removes it again.
set -euo pipefail
dist="$1" library="$(readlink -f "$2")" header="$3"
python="${GTP_PYTHON:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"  # runfiles copy of bindings/python
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")"

# A skip is reported as a skipped case, so tools/test_summary.py counts it as one.
skip() {
  echo "SKIPPED: $*"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    printf '<?xml version="1.0"?>\n<testsuites><testsuite name="wheel_test" tests="1" skipped="1">'`
          `'<testcase name="wheel_test"><skipped message="%s"/></testcase></testsuite></testsuites>\n' \
      "$(echo "$*" | tr -d '<>&"')" > "$XML_OUTPUT_FILE"
  fi
  exit 0
}

version="$(sed -n 's/^#define GTP_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$header" | paste -sd.)"
wheels=("$dist"/*.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "FAIL: expected one wheel in $dist, found ${wheels[*]}"; exit 1; }
whl="${wheels[0]}"
[ "$(basename "$whl")" = "libgtp-$version-py3-none-linux_x86_64.whl" ] \
  || { echo "FAIL: the wheel is $(basename "$whl"), expected libgtp-$version-py3-none-linux_x86_64.whl"; exit 1; }
"$python" "$here/wheel_check.py" inspect "$whl" "$library" "$version"

# Reproducible: the same inputs with other timestamps and permissions give the same bytes.
mkdir -p "$tmp/src/bindings/python" "$tmp/rebuilt"
(cd "$here/.." && find python/gtp -name '*.py' -exec cp --parents {} "$tmp/src/bindings/" \;)
cp "$library" "$tmp/libgtp.so" && cp "$header" "$tmp/gtp.h"
find "$tmp/src" "$tmp/libgtp.so" "$tmp/gtp.h" -type f -exec touch -d '2031-05-06 07:08:09' {} + -exec chmod 600 {} +
(cd "$tmp/src" && "$python" "$here/build_wheel.py" --header "$tmp/gtp.h" --library "$tmp/libgtp.so" \
  --strip bindings/python --out "$tmp/rebuilt" $(find bindings/python/gtp -name '*.py' | sort -r)) >/dev/null
cmp "$whl" "$tmp/rebuilt/$(basename "$whl")" \
  || { echo "FAIL: rebuilding from the same inputs at another time gave other bytes (not reproducible)"; exit 1; }
echo "reproducible: a rebuild with other mtimes, modes and file order is byte-identical"

"$python" -c "import venv" 2>/dev/null || skip "$python has no venv module (Debian: apt-get install python3-venv)"
"$python" -m pip --version >/dev/null 2>&1 || skip "$python has no pip (tools/setup.sh installs with it)"
# --system-site-packages: numpy and torch are the interpreter's (not downloaded again); pip itself
# too (--without-pip saves seconds), running with the venv's prefix so it installs into the venv.
venv="$tmp/venv"
"$python" -m venv --system-site-packages --without-pip "$venv"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1
unset PYTHONPATH GTP_LIBRARY PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS
extra="" torch=0
if "$venv/bin/python" -c "import torch" 2>/dev/null; then extra="[torch]" torch=1; fi
# --no-index: no network; the requirements (numpy, and torch for the extra) must already be met.
"$venv/bin/python" -m pip install --no-index "$whl$extra"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')"
[ -f "$site/gtp/libgtp.so" ] && [ -x "$site/gtp/libgtp.so" ] \
  || { echo "FAIL: pip did not install an executable $site/gtp/libgtp.so"; exit 1; }

# shellcheck source=../sanitizer_preload.sh
source "$here/../sanitizer_preload.sh"
preload_sanitizer_runtime "$library"
python_starts_preloaded "$venv/bin/python" \
  || skip "the venv's python crashes at start with LD_PRELOAD=$LD_PRELOAD (a sanitizer runtime that cannot" \
          "run in an uninstrumented interpreter); the wheel is checked in the plain and --config=asan builds"
cp "$here/wheel_check.py" "$tmp/wheel_check.py"  # -I and a folder outside the checkout: no source gtp
(cd "$tmp" && "$venv/bin/python" -I wheel_check.py smoke "$venv" "$version" $torch)
(cd "$tmp" && GTP_LIBRARY="$library" "$venv/bin/python" -I wheel_check.py smoke "$venv" "$version" $torch "$library")
unset LD_PRELOAD

"$venv/bin/python" -m pip uninstall -y libgtp
[ ! -e "$site/gtp" ] || { echo "FAIL: pip uninstall left $site/gtp (RECORD incomplete?): $(ls -R "$site/gtp")"; exit 1; }
if (cd "$tmp" && "$venv/bin/python" -I -c "import gtp" 2>/dev/null); then
  echo "FAIL: gtp still imports in the venv after pip uninstall"; exit 1
fi
echo PASS

# Sourced by the tests that load libgtp.so into a process not built with sanitizers (python3, the
# install test's C program): under --config=asan / --config=tsan the library needs its sanitizer
# runtime loaded first. Usage: preload_sanitizer_runtime LIBRARY
preload_sanitizer_runtime() {
  local needed runtime preload=""
  needed="$(readelf -d "$1" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(lib\(asan\|ubsan\|tsan\)\.so[.0-9]*\)\].*/\1/p')"
  for runtime in $needed; do
    preload="$preload $(gcc -print-file-name="$runtime")"
  done
  if [ -n "$preload" ]; then
    export LD_PRELOAD="${preload# }${LD_PRELOAD:+ $LD_PRELOAD}"
    # The interpreter's own allocations are not libgtp's leaks.
    export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    echo "sanitizer build: LD_PRELOAD=$LD_PRELOAD"
  fi
}

# Whether PYTHON starts at all with the runtime preloaded. ThreadSanitizer's runtime crashes an
# uninstrumented python3 at start (seen with GCC 12's libtsan on Debian; the instrumented C++ tests
# are unaffected), so under --config=tsan the Python parts of the tests skip, saying why. The
# subshell keeps bash's own "Segmentation fault" line out of the log.
python_starts_preloaded() {
  [ -z "${LD_PRELOAD:-}" ] || ( "$1" -c pass ) >/dev/null 2>&1
}

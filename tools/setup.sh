#!/usr/bin/env bash
# Installs everything libgtp needs to build and test, and says what it did. Safe to run again.
set -euo pipefail

packages=(
  bazel-bootstrap      # Bazel 4.2.3, runs offline (WORKSPACE mode)
  g++                  # host compiler, also used by nvcc
  python3              # test summary, peer scripts
  libhwloc-dev         # topology discovery
  libucx-dev           # host transport and bootstrap
  nlohmann-json3-dev   # profiles and records
  libgtest-dev         # unit tests
  libbenchmark-dev     # microbenchmarks
  pkg-config           # the install test builds a C program with `pkg-config --cflags --libs gtp`
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed: ${packages[*]}"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: installed ${missing[*]}"
fi

# Python packages for bindings/python (the gtp package, gtp.torch, their pytest suite), installed with
# pip into the python3 on PATH only when an import fails, so a second run changes nothing.
python_modules=(numpy pytest torch)
missing_python=()
for m in "${python_modules[@]}"; do
  python3 -c "import $m" >/dev/null 2>&1 || missing_python+=("$m")
done
if [ ${#missing_python[@]} -eq 0 ]; then
  echo "setup: Python packages already installed for $(python3 -c 'import sys; print(sys.executable)'): ${python_modules[*]}"
else
  echo "setup: pip installing ${missing_python[*]} (PyPI) for $(python3 -c 'import sys; print(sys.executable)')"
  python3 -m pip install --quiet "${missing_python[@]}"
  echo "setup: installed ${missing_python[*]}"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found: $(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1)"
else
  echo "setup: ERROR: no CUDA toolkit at /usr/local/cuda (nvcc is needed to compile the kernels;" \
       "install the CUDA toolkit there, it is not a Debian package)" >&2
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: GPU present: $(nvidia-smi -L | head -n 1)"
else
  echo "setup: no GPU on this machine: GPU tests will skip, benchmarks use the CPU reference path"
fi

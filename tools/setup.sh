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
  cmake                # //bindings:cmake_test builds a C++ consumer with find_package(gtp CONFIG)
  clang                # bazel test --config=fuzz //fuzz:all (libFuzzer targets, docs/reliability.md)
  libclang-rt-dev      # clang's libFuzzer, ASan and UBSan runtimes
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

# Python packages for bindings/python (the gtp package, gtp.torch, their pytest suite) and
# tools/plot_results.py, at the versions tools/constraints.txt pins (with everything they pull in), into
# the python3 on PATH. Only what is missing or at another version is installed, so a second run changes
# nothing.
constraints="$(dirname "$0")/constraints.txt"
python_packages=(numpy pytest torch matplotlib psutil)
mismatched=()
for p in "${python_packages[@]}"; do
  pinned="$(grep -i "^${p}==" "$constraints" | cut -d= -f3)"
  installed="$(python3 -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null || true)"
  # A local build tag (torch's +cu132) is the same release.
  [ "${installed%%+*}" = "$pinned" ] || mismatched+=("$p==$pinned")
done
python="$(python3 -c 'import sys; print(sys.executable)')"
if [ ${#mismatched[@]} -eq 0 ]; then
  echo "setup: Python packages already at the pinned versions for $python: ${python_packages[*]}"
else
  echo "setup: pip installing ${mismatched[*]} (PyPI, pinned by tools/constraints.txt) for $python"
  python3 -m pip install --quiet --disable-pip-version-check -c "$constraints" "${mismatched[@]}"
  echo "setup: installed ${mismatched[*]}"
fi

# megatron-core (gtp.megatron's CPU tests drive its real layers, parallel state and checkpoints): pip
# installs it on Python >= 3.12, what its wheel declares. It is pure Python but for one dataset helper,
# and imports (without TransformerEngine) on 3.11 too, where pip refuses the cp312 wheel: there the
# pinned wheel is downloaded with pip and its Python files unpacked into site-packages (the helper .so
# left out), with its metadata, so importlib.metadata sees the version.
megatron_pin="$(grep -i '^megatron-core==' "$constraints" | cut -d= -f3)"
megatron_have="$(python3 -c "import importlib.metadata as m; print(m.version('megatron-core'))" 2>/dev/null || true)"
if [ "$megatron_have" = "$megatron_pin" ]; then
  echo "setup: megatron-core $megatron_pin already installed for $python"
elif python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps "megatron-core==$megatron_pin"
  echo "setup: installed megatron-core $megatron_pin (pip, no extras: gtp.megatron needs torch, numpy, packaging)"
else
  wheel_dir="$(mktemp -d)"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 "megatron-core==$megatron_pin" -d "$wheel_dir"
  python3 - "$wheel_dir" <<'PY'
import glob, sys, sysconfig, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/megatron_core-*.whl")[0])
names = [n for n in wheel.namelist() if n.endswith((".py", ".json", ".typed")) or ".dist-info/" in n]
wheel.extractall(sysconfig.get_paths()["purelib"], members=names)
print(f"setup: unpacked megatron-core's {len(names)} Python files into {sysconfig.get_paths()['purelib']} "
      "(Python < 3.12: pip refuses its cp312 wheel)")
PY
  rm -rf "$wheel_dir"
fi

# TransformerEngine's own CPU reference quantizer (tests/test_te_reference.py checks libgtp's NVFP4 TE tensors
# against it): the pinned pure-Python wheel transformer-engine (1.2 MB download, 12 MB unpacked, no compiled
# code), unpacked by pip into .te-reference in the checkout, NOT into site-packages: its package __init__
# loads TE's CUDA library, and installed, Megatron-Core would take TE for present. A failure is reported
# and leaves that test skipping, saying why.
te_pin="$(grep -i '^transformer-engine==' "$constraints" | cut -d= -f3)"
te_dir="$(cd "$(dirname "$0")/.." && pwd)/.te-reference"
if [ -d "$te_dir/transformer_engine-$te_pin.dist-info" ]; then
  echo "setup: $te_dir already holds transformer-engine $te_pin"
elif rm -rf "$te_dir" && python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$te_dir" \
     "transformer-engine==$te_pin"; then
  echo "setup: unpacked transformer-engine $te_pin (pure Python) into $te_dir for tests/test_te_reference.py"
else
  rm -rf "$te_dir"
  echo "setup: WARNING: could not unpack transformer-engine $te_pin (see pip's message above): tests/test_te_reference.py will skip" >&2
fi

# Megatron Bridge 0.6.2 (gtp.bridge's tests, //bindings/python:bridge_test) needs Python >= 3.12: where
# pyenv has a 3.12, a virtual environment .venv312 in the checkout with every package of
# tools/constraints-bridge.txt (about 6 GB, mostly torch's CUDA wheels, about 6 minutes). Made again only
# when the constraints change. A failure here is reported and leaves the bridge tests skipping, saying why.
py312="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 2>/dev/null | sort -V | tail -n 1)"
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv312"
bridge_pins="$(dirname "$0")/constraints-bridge.txt"
stamp="$(sha256sum "$bridge_pins" | cut -c1-16)"
if [ -z "$py312" ]; then
  echo "setup: no Python 3.12 under pyenv: the Megatron Bridge tests will skip"
elif [ "$(cat "$venv/.constraints" 2>/dev/null)" = "$stamp" ]; then
  echo "setup: $venv already holds tools/constraints-bridge.txt"
elif rm -rf "$venv" && "$py312" -m venv "$venv" &&
     "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$bridge_pins"; then
  echo "$stamp" > "$venv/.constraints"
  echo "setup: made $venv ($("$py312" --version), tools/constraints-bridge.txt) for the Megatron Bridge tests"
else
  rm -rf "$venv"
  echo "setup: WARNING: could not make $venv (see pip's message above): the Megatron Bridge tests will skip" >&2
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

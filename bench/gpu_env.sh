# Sourced by the GPU-machine scripts: NVLink multicast stays off, and the libraries the carried
# binaries need come from the machine, else from a pip-installed NCCL / cuBLAS and the carried .carry/lib.
export NCCL_NVLS_ENABLE=0
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
fi
# cuBLAS (gtp-overlap-bench): the toolkit's, else the pip wheel's (nvidia-cublas).
if ! ldconfig -p | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
  cublas_dir=$(python3 -c 'import glob, os, nvidia
print(next((os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "libcublas.so.13"), recursive=True)), ""))' 2>/dev/null)
  [ -n "$cublas_dir" ] && export LD_LIBRARY_PATH="$cublas_dir:${LD_LIBRARY_PATH:-}"
fi
{ ldconfig -p | grep -q libucp.so.0 && ldconfig -p | grep -q libhwloc.so.15 && ldconfig -p | grep -q libbenchmark.so.1debian; } ||
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.carry/lib"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gtp::remat {
namespace {

__global__ void add_kernel(const float* src, float* dst, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] += src[i];
  }
}

}  // namespace

void add_fp32_cuda(const float* src, float* dst, std::int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr int kThreads = 256;
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  add_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(src, dst, count);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string("add_fp32_cuda: ") + cudaGetErrorString(error));
}

}  // namespace gtp::remat

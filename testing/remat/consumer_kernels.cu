#include "testing/remat/consumer_kernels.h"

#include <stdexcept>
#include <string>

namespace gtp::remat::testing {
namespace {

constexpr int kThreads = 128;

__device__ float bf16(const unsigned short* w, std::int64_t i) { return __uint_as_float(static_cast<unsigned>(w[i]) << 16); }

__global__ void forward_kernel(const unsigned short* w, const float* x, float* y, std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.0f;
  for (std::int64_t c = 0; c < cols; ++c) sum = fmaf(bf16(w, r * cols + c), x[c], sum);
  y[r] = sum;
}

__global__ void input_grad_kernel(const unsigned short* w, const float* dy, float* dx, std::int64_t rows,
                                  std::int64_t cols) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) sum = fmaf(bf16(w, r * cols + c), dy[r], sum);
  dx[c] = sum;
}

__global__ void weight_grad_kernel(const float* dy, const float* x, float* g, std::int64_t rows, std::int64_t cols) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  g[i] += dy[i / cols] * x[i % cols];
}

unsigned blocks(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

void launched(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

}  // namespace

void forward_cuda(const void* w, const float* x, float* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  forward_kernel<<<blocks(rows), kThreads, 0, stream>>>(static_cast<const unsigned short*>(w), x, y, rows, cols);
  launched("forward_kernel");
}

void input_grad_cuda(const void* w, const float* dy, float* dx, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream) {
  input_grad_kernel<<<blocks(cols), kThreads, 0, stream>>>(static_cast<const unsigned short*>(w), dy, dx, rows, cols);
  launched("input_grad_kernel");
}

void weight_grad_cuda(const float* dy, const float* x, float* g, std::int64_t rows, std::int64_t cols,
                      cudaStream_t stream) {
  weight_grad_kernel<<<blocks(rows * cols), kThreads, 0, stream>>>(dy, x, g, rows, cols);
  launched("weight_grad_kernel");
}

}  // namespace gtp::remat::testing

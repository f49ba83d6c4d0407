// Consumer kernels for the CUDA-graph test: a layer's forward, input-gradient and weight-gradient
// products reading a materialized BF16 weight. One thread per output element, each summing in a fixed
// order, so eager runs and graph replays give the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gtp::remat::testing {

// y[r] = sum_c W[r, c] x[c]; W is BF16 [rows, cols].
void forward_cuda(const void* w, const float* x, float* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream);
// dx[c] = sum_r W[r, c] dy[r].
void input_grad_cuda(const void* w, const float* dy, float* dx, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream);
// g[r, c] += dy[r] x[c] (the consumer adds its wgrad into the grad buffer).
void weight_grad_cuda(const float* dy, const float* x, float* g, std::int64_t rows, std::int64_t cols,
                      cudaStream_t stream);

}  // namespace gtp::remat::testing

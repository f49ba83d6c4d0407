// The runtime on the CUDA backend with a size-1 NCCL group, end to end: register, re-pack,
// materialize (bit-identical to the shard), gradients into the main grad. Skips without a GPU.
#include "remat/cuda_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;

TEST(CudaBackend, SizeOneNcclGroupEndToEnd) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
  comm::NcclComm nccl = comm::NcclComm::create_world(*bootstrap[0], milliseconds(30000));
  CudaBackend backend(0, {&nccl}, milliseconds(30000));
  Runtime runtime(backend, RuntimeConfig{});

  const std::int64_t rows = 40, cols = 64;
  std::vector<std::uint16_t> host(rows * cols);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint16_t>(0x3C00 + (i % 512));
  void* shard = nullptr;
  float* main_grad = nullptr;
  ASSERT_EQ(cudaMalloc(&shard, host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&main_grad), rows * cols * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(shard, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(main_grad, 0, rows * cols * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  WeightDesc desc;
  desc.name = "w";
  desc.shard = shard;
  desc.rows = rows;
  desc.cols = cols;
  desc.main_grad = main_grad;
  const WeightId id = runtime.register_weight(desc);
  runtime.shard_updated(&id, 1, stream);
  for (int step = 0; step < 3; ++step) {
    const auto out = runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, stream);
    std::vector<std::uint16_t> got(host.size());
    ASSERT_EQ(cudaMemcpyAsync(got.data(), out[0], got.size() * 2, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    runtime.release(&id, 1, stream);
    float* grad = runtime.grad_buffer(id, stream);
    std::vector<float> ones(rows * cols, 1.0f);
    ASSERT_EQ(cudaMemcpyAsync(grad, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
    runtime.finalize(&id, 1, true, stream);
    runtime.drain(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(std::memcmp(got.data(), host.data(), host.size() * 2), 0) << "step " << step;
  }
  std::vector<float> grads(rows * cols);
  ASSERT_EQ(cudaMemcpy(grads.data(), main_grad, grads.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float g : grads) ASSERT_EQ(g, 3.0f);
  EXPECT_GT(runtime.stats().prefetch_hits, 0);
  cudaStreamDestroy(stream);
  cudaFree(shard);
  cudaFree(main_grad);
}

}  // namespace
}  // namespace gtp::remat

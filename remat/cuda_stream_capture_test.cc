// The CUDA backend across streams and under CUDA graph capture: a collective batch of size-1
// all-gathers over two streams, in place, and replayed from a captured graph; keep_gathered slots read
// from a second consumer stream, and keep_gathered refused under capture. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "testing/remat/cuda_test_group.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;
using testing::SizeOneGroup;

// A collective batch of all-gathers on a size-1 group (one NCCL group: NCCL's one-rank path copies
// each) delivers every buffer, of any size, on two streams, and moves nothing in place; captured
// into a CUDA graph, every replay delivers again. A batch over an aborted communicator fails.
TEST(CudaBackend, BatchedSizeOneAllGathersDeliverEagerlyAndUnderCapture) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  SizeOneGroup group;  // the split child gathers, so that aborting it cannot reach the other one
  CudaBackend backend(0, {CudaGroup{&group.reduce_scatter, &group.gather}}, milliseconds(30000));
  const Stream streams[2] = {backend.side_stream(0, Role::kGather), backend.side_stream(0, Role::kReduceScatter)};

  const std::vector<std::size_t> sizes = {1000, 256, 4096, 4097, 16};  // the last one gathered in place
  std::mt19937 random(20261203);
  std::vector<std::vector<unsigned char>> sources;
  std::vector<void*> send(sizes.size());
  std::vector<void*> recv(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sources.emplace_back(sizes[i]);
    for (unsigned char& byte : sources.back()) byte = static_cast<unsigned char>(random());
    ASSERT_EQ(cudaMalloc(&send[i], sizes[i]), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(send[i], sources[i].data(), sizes[i], cudaMemcpyHostToDevice), cudaSuccess);
    recv[i] = send[i];
    if (i + 1 < sizes.size()) {
      ASSERT_EQ(cudaMalloc(&recv[i], sizes[i]), cudaSuccess);
    }
  }
  const auto poison = [&] {
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
      ASSERT_EQ(cudaMemset(recv[i], 0xA5, sizes[i]), cudaSuccess);
    }
  };
  const auto gather_all = [&](const Stream* on) {
    Backend::CollectiveBatch batch(backend);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      backend.all_gather(on[i % 2], 0, send[i], recv[i], static_cast<std::int64_t>(sizes[i]));
    }
    batch.launch();
  };
  const auto expect_delivered = [&] {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<unsigned char> got(sizes[i]);
      ASSERT_EQ(cudaMemcpy(got.data(), recv[i], sizes[i], cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, sources[i]) << "all-gather " << i << " of " << sizes[i] << " bytes";
    }
  };

  poison();
  gather_all(streams);  // eager, over two streams
  expect_delivered();

  cudaStream_t captured = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking), cudaSuccess);
  const Stream on_captured[2] = {captured, captured};
  ASSERT_EQ(cudaStreamBeginCapture(captured, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    Backend::CallScope call(backend);
    EXPECT_TRUE(backend.capturing(captured));
    gather_all(on_captured);
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(captured, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison();
    ASSERT_EQ(cudaGraphLaunch(exec, captured), cudaSuccess);
    expect_delivered();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(captured);

  group.reduce_scatter.abort();
  EXPECT_THROW(gather_all(streams), CudaError);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    cudaFree(send[i]);
    if (recv[i] != send[i]) cudaFree(recv[i]);
  }
}

// keep_gathered on the CUDA backend: the backward, on a second consumer stream, reads the slot the
// forward gathered into (waiting on that fill's event, kept for it), bit-exact over steps whose shards
// change, with freed slots poisoned; one gather per step. Under graph capture the runtime refuses
// before enqueuing anything, and the capture still ends cleanly.
TEST(CudaBackend, KeptSlotsServeAnotherStreamAndCaptureIsRefused) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  RuntimeConfig config;
  config.keep_gathered = true;
  config.cache.poison_released = true;
  Runtime runtime(backend, config);

  const std::int64_t rows = 48, cols = 64;
  void* shard = nullptr;
  ASSERT_EQ(cudaMalloc(&shard, rows * cols * 2), cudaSuccess);
  cudaStream_t forward = nullptr, backward = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&forward, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&backward, cudaStreamNonBlocking), cudaSuccess);
  WeightDesc desc;
  desc.name = "w";
  desc.shard = shard;
  desc.rows = rows;
  desc.cols = cols;
  const WeightId id = runtime.register_weight(desc);
  constexpr int kSteps = 4;
  std::vector<std::uint16_t> host(rows * cols), seen_forward(host.size()), seen_backward(host.size());
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint16_t>(0x3C00 + (i * 7 + step) % 1024);
    ASSERT_EQ(cudaMemcpyAsync(shard, host.data(), host.size() * 2, cudaMemcpyHostToDevice, forward), cudaSuccess);
    runtime.shard_updated(&id, 1, forward);
    const void* first = runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, forward)[0];
    ASSERT_EQ(cudaMemcpyAsync(seen_forward.data(), first, host.size() * 2, cudaMemcpyDeviceToHost, forward), cudaSuccess);
    runtime.release(&id, 1, forward);
    const void* second = runtime.materialize(&id, 1, Phase::kBackward, 0, Layout::kBF16, backward)[0];
    EXPECT_EQ(second, first) << "step " << step << ": the backward reads the forward's slot";
    ASSERT_EQ(cudaMemcpyAsync(seen_backward.data(), second, host.size() * 2, cudaMemcpyDeviceToHost, backward),
              cudaSuccess);
    runtime.release(&id, 1, backward);
    runtime.drain(forward);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(seen_forward, host) << "step " << step;
    EXPECT_EQ(seen_backward, host) << "step " << step;
  }
  EXPECT_EQ(runtime.stats().kept_hits, kSteps);
  EXPECT_EQ(runtime.stats().exposed_gathers + runtime.stats().prefetches, kSteps) << runtime.stats_json();

  ASSERT_EQ(cudaStreamBeginCapture(forward, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  try {
    runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, forward);
    ADD_FAILURE() << "materialize under capture with keep_gathered was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("keep_gathered"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(forward, &graph), cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(forward);
  cudaStreamDestroy(backward);
  cudaFree(shard);
}

}  // namespace
}  // namespace gtp::remat

// gtp_context_check on the CUDA backend, where collectives outlive the calls that enqueue them: a
// reduce-scatter held back on the device past call_timeout_ms is reported as TIMEOUT naming the call
// that issued it, the group and the stream; before its deadline, and once it ran, the check passes.
// Skips without a GPU.
#include <cuda_runtime_api.h>

#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"

namespace {

void hold_stream(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }

TEST(CAbiCudaWatchdog, ACollectivePastItsDeadlineIsATimeoutNamingTheCallAndGroup) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.backend = GTP_BACKEND_CUDA;
  config.call_timeout_ms = 200;
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);

  const int64_t rows = 16, cols = 64;
  void* shard = nullptr;
  float* main_grad = nullptr;
  ASSERT_EQ(cudaMalloc(&shard, rows * cols * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(shard, 0, rows * cols * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&main_grad), rows * cols * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(main_grad, 0, rows * cols * sizeof(float)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "w";
  desc.shard = shard;
  desc.rows = rows;
  desc.cols = cols;
  desc.main_grad = main_grad;
  gtp_weight_t w{};
  ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, stream), GTP_SUCCESS) << gtp_last_error(ctx);
  float* grad = nullptr;
  ASSERT_EQ(gtp_grad_buffer(ctx, w, &grad, stream), GTP_SUCCESS) << gtp_last_error(ctx);  // zero-filled
  // The consumer stream is held for 1.5 s: the reduce-scatter stream waits for it (the wgrad).
  static int hold_ms = 1500;
  ASSERT_EQ(cudaLaunchHostFunc(stream, hold_stream, &hold_ms), cudaSuccess);
  ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, stream), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_EQ(gtp_context_check(ctx), GTP_SUCCESS) << gtp_last_error(ctx);  // within its deadline
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(gtp_context_check(ctx), GTP_ERROR_TIMEOUT);
  const std::string message = gtp_last_error(ctx);
  for (const char* name : {"gtp_finalize", "gtp_remat", "reduce_scatter", "call_timeout_ms=200"}) {
    EXPECT_NE(message.find(name), std::string::npos) << name << " missing: " << message;
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(gtp_drain(ctx, stream), GTP_SUCCESS) << gtp_last_error(ctx);  // one rank: nobody to abort
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(gtp_context_check(ctx), GTP_SUCCESS) << gtp_last_error(ctx);  // everything ran
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  cudaStreamDestroy(stream);
  cudaFree(shard);
  cudaFree(main_grad);
}

}  // namespace

// GTP_BACKEND_CUDA through the C ABI. On a machine without a CUDA device (CPU CI) create must fail
// with GTP_ERROR_CUDA and say why; on a GPU a 1-rank context (a size-1 NCCL world split into its
// groups) materializes device-resident BF16 weights on every wire format on a real stream, byte-equal
// to a host-backend context on the same data (the host backend runs kernels/reference.h), its FP8 and
// NVFP4 amax slots (gtp_weight_amax, device memory) equal to the host context's, reduces a
// gradient into a device main grad (through the group's second, reduce-scatter communicator), reports
// stats, and aborts without hanging.
#include <cuda_runtime_api.h>

#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"

namespace {

using gtp::cabi_test::stats_of;

constexpr int64_t kRows = 40, kCols = 64;
constexpr int kWires = 6;
// With the descriptor's variants (0.3): MXFP8 FLOOR rounding and NVFP4 16x16 blocks.
const gtp_wire_t kWireList[kWires] = {GTP_WIRE_BF16,  GTP_WIRE_FP8,   GTP_WIRE_MXFP8,
                                      GTP_WIRE_NVFP4, GTP_WIRE_MXFP8, GTP_WIRE_NVFP4};
const int32_t kMxRounding[kWires] = {GTP_MX_ROUNDING_RCEIL, GTP_MX_ROUNDING_RCEIL, GTP_MX_ROUNDING_RCEIL,
                                     GTP_MX_ROUNDING_RCEIL, GTP_MX_ROUNDING_FLOOR, GTP_MX_ROUNDING_RCEIL};
const int32_t kNvfp4_2d[kWires] = {0, 0, 0, 0, 0, 1};
const char* const kNames[kWires] = {"bf16", "fp8", "mxfp8", "nvfp4", "mxfp8_floor", "nvfp4_2d"};

gtp_status_t create(const gtp_bootstrap_callbacks_t& callbacks, gtp_backend_t backend, gtp_context_t** ctx) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.backend = backend;
  return gtp_context_create(&config, ctx);
}

TEST(CAbiCuda, WithoutADeviceCreateIsACudaErrorThatSaysSo) {
  std::string why;
  if (gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "a CUDA device is present; this test needs none";
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_t* ctx = nullptr;
  EXPECT_GTP_ERROR(create(callbacks, GTP_BACKEND_CUDA, &ctx), GTP_ERROR_CUDA, nullptr, "GTP_BACKEND_CUDA needs a CUDA device");
  EXPECT_NE(std::string(gtp_last_error(nullptr)).find("GTP_BACKEND_HOST"), std::string::npos) << gtp_last_error(nullptr);
  EXPECT_EQ(ctx, nullptr);
}

// The weights of one context: BF16 source bits (host copy) and the shard the context reads.
struct Weights {
  gtp_weight_t handles[kWires];
};

std::vector<uint16_t> source_bits() {
  std::vector<uint16_t> bits(kRows * kCols);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    // Varied magnitudes and signs so that every wire format quantizes something.
    bits[i] = static_cast<uint16_t>(((i * 37) % 2 ? 0x8000 : 0) | (0x3A00 + (i * 131) % 0x0A00));
  }
  return bits;
}

// Registers one weight per wire over `shard` (host or device memory, per the context's backend).
Weights register_all(gtp_context_t* ctx, const void* shard, float* const* main_grads) {
  Weights w{};
  for (int i = 0; i < kWires; ++i) {
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = kNames[i];
    desc.shard = shard;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.wire = kWireList[i];
    desc.mx_rounding = kMxRounding[i];
    desc.nvfp4_2d = kNvfp4_2d[i];
    desc.main_grad = main_grads[i];
    EXPECT_EQ(gtp_weight_register(ctx, &desc, &w.handles[i]), GTP_SUCCESS) << gtp_last_error(ctx);
  }
  EXPECT_EQ(gtp_weights_shard_updated(ctx, w.handles, kWires, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  return w;
}

TEST(CAbiCuda, OneRankMaterializesEveryWireLikeTheReferenceAndReducesGrads) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  const std::vector<uint16_t> bits = source_bits();
  const size_t elements = bits.size();

  // Reference: the host backend on host memory.
  gtp_context_t* host = nullptr;
  ASSERT_EQ(create(callbacks, GTP_BACKEND_HOST, &host), GTP_SUCCESS) << gtp_last_error(nullptr);
  float* no_grads[kWires] = {};
  const Weights host_w = register_all(host, bits.data(), no_grads);
  void* expected_ptrs[kWires] = {};
  size_t count = 0;
  ASSERT_EQ(gtp_materialize(host, host_w.handles, kWires, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, expected_ptrs, kWires,
                            &count, nullptr), GTP_SUCCESS) << gtp_last_error(host);
  std::vector<std::vector<uint16_t>> expected(kWires);
  for (int i = 0; i < kWires; ++i) {
    const auto* p = static_cast<const uint16_t*>(expected_ptrs[i]);
    expected[i].assign(p, p + elements);
  }
  ASSERT_EQ(gtp_release(host, host_w.handles, kWires, nullptr), GTP_SUCCESS) << gtp_last_error(host);
  // gtp_weight_amax (0.7.1): the FP8 and NVFP4 weights' amax, in host memory on the host backend.
  std::vector<float> expected_amax(kWires, -1.0f);
  for (int i = 0; i < kWires; ++i) {
    const float* slot = nullptr;
    if (gtp_weight_amax(host, host_w.handles[i], &slot) == GTP_SUCCESS) expected_amax[i] = *slot;
  }
  ASSERT_EQ(gtp_context_destroy(host), GTP_SUCCESS);
  EXPECT_NE(expected[0], expected[1]) << "FP8 reproduced BF16 exactly: the data does not tell the wires apart";

  // The CUDA backend on device memory, on the current device.
  void* shard = nullptr;
  float* main_grads[kWires] = {};
  ASSERT_EQ(cudaMalloc(&shard, elements * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(shard, bits.data(), elements * sizeof(uint16_t), cudaMemcpyHostToDevice), cudaSuccess);
  for (float*& g : main_grads) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&g), elements * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(g, 0, elements * sizeof(float)), cudaSuccess);
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(create(callbacks, GTP_BACKEND_CUDA, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  const Weights w = register_all(ctx, shard, main_grads);
  const std::vector<float> grad_host(elements, 0.5f);
  for (int step = 0; step < 2; ++step) {
    void* ptrs[kWires] = {};
    ASSERT_EQ(gtp_materialize(ctx, w.handles, kWires, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, kWires, &count, stream),
              GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(count, static_cast<size_t>(kWires));
    std::vector<std::vector<uint16_t>> got(kWires, std::vector<uint16_t>(elements));
    for (int i = 0; i < kWires; ++i) {
      ASSERT_EQ(cudaMemcpyAsync(got[i].data(), ptrs[i], elements * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
    }
    // The amax slots (device memory), read on the stream the materialize ordered after the packs.
    std::vector<float> amax(kWires, -1.0f);
    for (int i = 0; i < kWires; ++i) {
      const float* slot = nullptr;
      const gtp_status_t status = gtp_weight_amax(ctx, w.handles[i], &slot);
      const bool has_amax = kWireList[i] == GTP_WIRE_FP8 || kWireList[i] == GTP_WIRE_NVFP4;
      ASSERT_EQ(status, has_amax ? GTP_SUCCESS : GTP_ERROR_INVALID_ARGUMENT) << kNames[i] << gtp_last_error(ctx);
      if (has_amax) {
        ASSERT_EQ(cudaMemcpyAsync(&amax[i], slot, sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
      }
    }
    ASSERT_EQ(gtp_release(ctx, w.handles, kWires, stream), GTP_SUCCESS) << gtp_last_error(ctx);
    for (int i = 0; i < kWires; ++i) {
      float* grad = nullptr;
      ASSERT_EQ(gtp_grad_buffer(ctx, w.handles[i], &grad, stream), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(cudaMemcpyAsync(grad, grad_host.data(), elements * sizeof(float), cudaMemcpyHostToDevice, stream),
                cudaSuccess);
    }
    ASSERT_EQ(gtp_finalize(ctx, w.handles, kWires, 1, stream), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, stream), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int i = 0; i < kWires; ++i) EXPECT_EQ(got[i], expected[i]) << kNames[i] << " step " << step;
    for (int i = 0; i < kWires; ++i) EXPECT_EQ(amax[i], expected_amax[i]) << kNames[i] << " amax, step " << step;
    EXPECT_GT(expected_amax[1], 0.0f) << "the host context's FP8 amax";
  }
  // G = 1: the mean is the gradient itself, added once per step.
  for (int i = 0; i < kWires; ++i) {
    std::vector<float> main(elements);
    ASSERT_EQ(cudaMemcpy(main.data(), main_grads[i], elements * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t e = 0; e < elements; ++e) ASSERT_EQ(main[e], 1.0f) << kNames[i] << " element " << e;
  }
  const nlohmann::json stats = stats_of(ctx);
  EXPECT_EQ(stats.at("backend"), "cuda") << stats;
  EXPECT_EQ(stats.at("materialize").at("calls").get<int>(), 2) << stats;  // one per gtp_materialize
  EXPECT_EQ(stats.at("grads").at("reduce_scatters").get<int>(), 2 * kWires) << stats;
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);

  // Abort: later calls fail at once, destroy does not hang.
  ASSERT_EQ(create(callbacks, GTP_BACKEND_CUDA, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  const Weights again = register_all(ctx, shard, main_grads);
  EXPECT_EQ(gtp_context_abort(ctx), GTP_SUCCESS);
  void* ptr = nullptr;
  EXPECT_GTP_ERROR(gtp_materialize(ctx, again.handles, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, stream),
                   GTP_ERROR_INVALID_STATE, ctx, "aborted");
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);

  cudaStreamDestroy(stream);
  for (float* g : main_grads) cudaFree(g);
  cudaFree(shard);
}

// The GEMM layout on the CUDA backend, row-major and blocked 128x4 scales (MXFP8, NVFP4 1D and 2D):
// every section byte-equal to a host context's on the same data (the host backend runs the reference).
TEST(CAbiCuda, GemmLayoutInBothScaleLayoutsMatchesTheHostContext) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  const std::vector<uint16_t> bits = source_bits();
  void* shard = nullptr;
  ASSERT_EQ(cudaMalloc(&shard, bits.size() * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(shard, bits.data(), bits.size() * sizeof(uint16_t), cudaMemcpyHostToDevice), cudaSuccess);
  struct Case {
    gtp_wire_t wire;
    int32_t nvfp4_2d, scale_layout;
  };
  const Case cases[] = {{GTP_WIRE_MXFP8, 0, GTP_SCALE_LAYOUT_ROW_MAJOR}, {GTP_WIRE_MXFP8, 0, GTP_SCALE_LAYOUT_BLOCKED_128X4},
                        {GTP_WIRE_NVFP4, 0, GTP_SCALE_LAYOUT_BLOCKED_128X4}, {GTP_WIRE_NVFP4, 1, GTP_SCALE_LAYOUT_ROW_MAJOR},
                        {GTP_WIRE_NVFP4, 1, GTP_SCALE_LAYOUT_BLOCKED_128X4}};
  // Every section of the case's GEMM view, as host bytes, from a context of `backend`.
  auto sections_of = [&](gtp_backend_t backend, const void* weight_shard, const Case& c) {
    std::vector<std::vector<unsigned char>> out;
    gtp_context_t* ctx = nullptr;
    EXPECT_EQ(create(callbacks, backend, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
    if (ctx == nullptr) return out;
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "gemm";
    desc.shard = weight_shard;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.wire = c.wire;
    desc.nvfp4_2d = c.nvfp4_2d;
    desc.gemm_scale_layout = c.scale_layout;
    gtp_weight_t w{};
    EXPECT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    gtp_materialized_t v = GTP_MATERIALIZED_INITIALIZER;
    size_t count = 0;
    EXPECT_EQ(gtp_materialize_views(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, &v, 1, &count, nullptr),
              GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(v.scale_layout, c.scale_layout);
    for (const gtp_section_t* s : {&v.data, &v.scales, &v.data_t, &v.scales_t, &v.decode_scales}) {
      const size_t element_bits = s->dtype == GTP_ELEM_E2M1 ? 4 : s->dtype == GTP_ELEM_FP32 ? 32 : 8;
      std::vector<unsigned char> bytes(static_cast<size_t>(s->rows * s->cols) * element_bits / 8);
      if (!bytes.empty()) EXPECT_EQ(cudaMemcpy(bytes.data(), s->ptr, bytes.size(), cudaMemcpyDefault), cudaSuccess);
      out.push_back(std::move(bytes));
    }
    EXPECT_EQ(gtp_release_layout(ctx, &w, 1, GTP_LAYOUT_GEMM, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
    return out;
  };
  const char* const section_names[] = {"data", "scales", "data_t", "scales_t", "decode_scales"};
  for (const Case& c : cases) {
    const auto want = sections_of(GTP_BACKEND_HOST, bits.data(), c);
    const auto got = sections_of(GTP_BACKEND_CUDA, shard, c);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_FALSE(want[1].empty()) << "the case has no scales";
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "wire " << c.wire << " nvfp4_2d " << c.nvfp4_2d << " scale layout "
                                 << c.scale_layout << ": " << section_names[i];
    }
  }
  cudaFree(shard);
}

}  // namespace

// Built with CMake against an installed libgtp (find_package(gtp CONFIG), target gtp::gtp): one rank
// on the host backend registers a weight, materializes it, checks every BF16 value, then writes a
// gradient, finalizes and drains, and checks the main grad (a group of one: the gradient itself).
#include <gtp/gtp.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

gtp_bootstrap_result_t allgather(void*, const void* send, void* recv, size_t bytes, int64_t) {
  std::memcpy(recv, send, bytes);  // one rank
  return GTP_BOOTSTRAP_OK;
}
gtp_bootstrap_result_t broadcast(void*, void*, size_t, int32_t, int64_t) { return GTP_BOOTSTRAP_OK; }
gtp_bootstrap_result_t barrier(void*, int64_t) { return GTP_BOOTSTRAP_OK; }

int ready = 0;
void grad_ready(void*, gtp_weight_t) { ++ready; }

bool ok(gtp_context_t* ctx, gtp_status_t s, const char* call) {
  if (s != GTP_SUCCESS) std::fprintf(stderr, "%s failed: %s: %s\n", call, gtp_status_string(s), gtp_last_error(ctx));
  return s == GTP_SUCCESS;
}
#define CHECK(call) \
  if (!ok(ctx, (call), #call)) return 1

constexpr int kRows = 32, kCols = 16;

}  // namespace

int main() {
  gtp_context_t* ctx = nullptr;
  gtp_bootstrap_callbacks_t callbacks = {sizeof(gtp_bootstrap_callbacks_t), GTP_BOOTSTRAP_CALLBACKS_VERSION, 0, 1,
                                         nullptr, allgather, broadcast, barrier, nullptr};
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.grad_ready = grad_ready;
  CHECK(gtp_context_create(&config, &ctx));
  std::vector<float> shard(kRows * kCols), main_grad(kRows * kCols, 0.0f);
  for (int i = 0; i < kRows * kCols; ++i) shard[i] = static_cast<float>(i % 89) - 44.0f;  // exact in BF16
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "w";
  desc.shard = shard.data();
  desc.dtype = GTP_DTYPE_FP32;
  desc.rows = kRows;
  desc.cols = kCols;
  desc.main_grad = main_grad.data();
  gtp_weight_t w;
  CHECK(gtp_weight_register(ctx, &desc, &w));
  CHECK(gtp_weights_shard_updated(ctx, &w, 1, nullptr));
  void* ptr = nullptr;
  size_t count = 0;
  CHECK(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr));
  int wrong = 0;
  for (int i = 0; i < kRows * kCols; ++i) {
    uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(ptr)[i]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    wrong += value != shard[i];
  }
  CHECK(gtp_release(ctx, &w, 1, nullptr));
  float* grad = nullptr;
  CHECK(gtp_grad_buffer(ctx, w, &grad, nullptr));
  for (int i = 0; i < kRows * kCols; ++i) grad[i] += 0.25f * static_cast<float>(i % 7);
  CHECK(gtp_finalize(ctx, &w, 1, 1, nullptr));
  CHECK(gtp_drain(ctx, nullptr));
  for (int i = 0; i < kRows * kCols; ++i) wrong += main_grad[i] != 0.25f * static_cast<float>(i % 7);
  CHECK(gtp_context_destroy(ctx));
  std::printf("CMake consumer of libgtp %d.%d.%d: %zu weight materialized, grad_ready %d, %d wrong values\n",
              GTP_VERSION_MAJOR, GTP_VERSION_MINOR, GTP_VERSION_PATCH, count, ready, wrong);
  return wrong == 0 && count == 1 && ready == 1 ? 0 : 1;
}

// The C ABI driven by thread ranks (ThreadBootstrap behind the callbacks vtable) on the host backend:
// a training step bit-exact against the unsharded weight and the reference gradient, stats and trace
// JSON, and every misuse returning its status and a message that names the problem.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"

namespace {

using gtp::cabi_test::callbacks_for;
using gtp::cabi_test::create;
using gtp::cabi_test::kTimeout;
using gtp::cabi_test::on_ranks;

constexpr int64_t kRows = 40, kCols = 32;  // BF16 shards are 16-row aligned: G=2 -> 32 rows, G=4 -> 16 rows


uint16_t full_weight(int64_t row, int64_t col) {  // BF16 bits, distinct per element
  return static_cast<uint16_t>(0x3F80 + ((row * kCols + col) % 97));
}

std::string profile_json(int world, int shards) {
  return gtp::cabi_test::profile_with(world, {{"tensor_parallel_num_weight_shards", shards}});
}

struct Ready {
  std::vector<gtp_weight_t> weights;
};

void train_step(int world) {
  std::vector<Ready> ready(world);
  on_ranks(world, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string profile = profile_json(world, world);
    gtp_context_t* ctx = create(callbacks, profile.c_str(), 64,
                                [](void* user, gtp_weight_t w) { static_cast<Ready*>(user)->weights.push_back(w); },
                                &ready[rank]);
    ASSERT_NE(ctx, nullptr);
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(sizes.rank, rank);
    EXPECT_EQ(sizes.world_size, world);
    EXPECT_EQ(sizes.tp, 1);
    EXPECT_EQ(sizes.gtp_remat, world);
    EXPECT_EQ(sizes.dp, 1);
    EXPECT_EQ(sizes.data_parallel_count, world);
    EXPECT_EQ(sizes.data_parallel_index, rank);

    const int64_t shard_rows = world == 2 ? 32 : 16;
    const int64_t first = rank * shard_rows;
    const int64_t valid = std::max<int64_t>(0, std::min(shard_rows, kRows - first));
    std::vector<uint16_t> shard(std::max<int64_t>(valid, 1) * kCols);
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shard[r * kCols + c] = full_weight(first + r, c);
    std::vector<float> main_grad(std::max<int64_t>(valid, 1) * kCols, 1.0f);

    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "fc1";
    desc.shard = valid > 0 ? shard.data() : nullptr;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad.data();
    gtp_weight_t w{};
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    for (gtp_phase_t phase : {GTP_PHASE_FORWARD, GTP_PHASE_BACKWARD}) {
      void* ptr = nullptr;
      size_t count = 0;
      ASSERT_EQ(gtp_materialize(ctx, &w, 1, phase, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
          << gtp_last_error(ctx);
      ASSERT_EQ(count, 1u);
      const auto* full = static_cast<const uint16_t*>(ptr);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(full[r * kCols + c], full_weight(r, c)) << r << "," << c;
      if (phase == GTP_PHASE_BACKWARD) {
        float* g = nullptr;
        ASSERT_EQ(gtp_grad_buffer(ctx, w, &g, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t c = 0; c < kCols; ++c) g[r * kCols + c] = static_cast<float>((rank + 1) * (r + 1));
      }
      ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    const float mean = (world + 1) / 2.0f;  // mean over ranks of (rank + 1)
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(main_grad[r * kCols + c], 1.0f + mean * (first + r + 1)) << r;
    ASSERT_EQ(ready[rank].weights.size(), 1u);
    EXPECT_EQ(ready[rank].weights[0].id, w.id);
    EXPECT_EQ(ready[rank].weights[0].generation, w.generation);

    size_t len = 0;
    ASSERT_EQ(gtp_stats_json(ctx, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);
    std::vector<char> text(len + 1);
    ASSERT_EQ(gtp_stats_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
    const nlohmann::json stats = nlohmann::json::parse(text.data());
    EXPECT_EQ(stats.at("materialize").at("calls").get<int>(), 2) << text.data();
    ASSERT_EQ(gtp_trace_json(ctx, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);
    text.assign(len + 1, 0);
    ASSERT_EQ(gtp_trace_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_NO_THROW(nlohmann::json::parse(text.data()));
    EXPECT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbi, TrainingStepWith2Ranks) { train_step(2); }
TEST(CAbi, TrainingStepWith4Ranks) { train_step(4); }

// G = 1: an uninitialized grad buffer is the main grad itself (the reduce-scatter is the identity) unless
// the profile turns grads_into_main_grad off or the call asks for a separate buffer; all give the same
// main grad, the first with no reduce-scatter.
TEST(CAbi, OneRankGroupHandsOutTheMainGradAsTheUninitializedGradBuffer) {
  struct Case {
    bool profile_into_main_grad;
    uint32_t flags;
  };
  for (const Case c : {Case{true, GTP_GRAD_BUFFER_UNINITIALIZED}, Case{false, GTP_GRAD_BUFFER_UNINITIALIZED},
                       Case{true, GTP_GRAD_BUFFER_UNINITIALIZED | GTP_GRAD_BUFFER_SEPARATE}}) {
    const bool into_main_grad = c.profile_into_main_grad && (c.flags & GTP_GRAD_BUFFER_SEPARATE) == 0;
    SCOPED_TRACE("grads_into_main_grad " + std::to_string(c.profile_into_main_grad) + ", flags " +
                 std::to_string(c.flags));
    on_ranks(1, [&](int, const gtp_bootstrap_callbacks_t& callbacks) {
      const std::string profile = gtp::cabi_test::profile_with(
          1, {{"tensor_parallel_num_weight_shards", 1}},
          {{"gtp_remat", {{"grads_into_main_grad", c.profile_into_main_grad}}}});
      gtp_context_t* ctx = create(callbacks, profile.c_str(), 64);
      ASSERT_NE(ctx, nullptr);
      std::vector<uint16_t> shard(kRows * kCols);
      for (int64_t i = 0; i < kRows * kCols; ++i) shard[i] = full_weight(i / kCols, i % kCols);
      std::vector<float> main_grad(kRows * kCols, 0.5f);
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = "fc1";
      desc.shard = shard.data();
      desc.rows = kRows;
      desc.cols = kCols;
      desc.main_grad = main_grad.data();
      gtp_weight_t w{};
      ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
      for (int microbatch = 0; microbatch < 2; ++microbatch) {  // no accumulate_microbatches: one finalize each
        gtp_grad_buffer_t buffer = GTP_GRAD_BUFFER_INITIALIZER;
        ASSERT_EQ(gtp_grad_buffer_ex(ctx, w, c.flags, &buffer, nullptr), GTP_SUCCESS)
            << gtp_last_error(ctx);
        EXPECT_EQ(buffer.data == main_grad.data(), into_main_grad);
        EXPECT_EQ(buffer.overwrite, into_main_grad ? 0 : 1);
        for (int64_t i = 0; i < kRows * kCols; ++i) {
          const float wgrad = static_cast<float>(i % 13) + microbatch;
          buffer.data[i] = buffer.overwrite ? wgrad : buffer.data[i] + wgrad;
        }
        ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      }
      ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      for (int64_t i = 0; i < kRows * kCols; ++i) {
        ASSERT_EQ(main_grad[i], 0.5f + static_cast<float>(i % 13) + static_cast<float>(i % 13) + 1.0f) << i;
      }
      const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
      EXPECT_EQ(stats.at("grads").at("reduce_scatters").get<int>(), into_main_grad ? 0 : 2) << stats;
      EXPECT_EQ(stats.at("grads").at("into_main_grad").get<int>(), into_main_grad ? 2 : 0) << stats;
      EXPECT_EQ(stats.at("groups").at(0).at("grads_into_main_grad").get<bool>(), c.profile_into_main_grad) << stats;
      EXPECT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
      EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
    });
  }
}

// gtp_main_grads_zeroed on one rank: the first GTP_GRAD_BUFFER_SEPARATE buffer after it is the main grad to
// write (no reduce-scatter, no add), the next microbatch's is separate again; misuse refused by status.
TEST(CAbi, MainGradsDeclaredZeroAreTheFirstBufferToWrite) {
  on_ranks(1, [&](int, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string profile = profile_json(1, 1);
    gtp_context_t* ctx = create(callbacks, profile.c_str(), 64);
    ASSERT_NE(ctx, nullptr);
    std::vector<uint16_t> shard(kRows * kCols, 0x3F80);
    std::vector<float> main_grad(kRows * kCols, 7.0f);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "fc1";
    desc.shard = shard.data();
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad.data();
    gtp_weight_t w{}, no_grad{};
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    desc.name = "fc2";
    desc.main_grad = nullptr;
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &no_grad), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_main_grads_zeroed(ctx, &no_grad, 1), GTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gtp_last_error(ctx)).find("'fc2' was registered without a main grad"), std::string::npos)
        << gtp_last_error(ctx);
    EXPECT_EQ(gtp_main_grads_zeroed(ctx, nullptr, 2), GTP_ERROR_INVALID_ARGUMENT);
    std::fill(main_grad.begin(), main_grad.end(), 0.0f);
    ASSERT_EQ(gtp_main_grads_zeroed(ctx, nullptr, 0), GTP_SUCCESS) << gtp_last_error(ctx);
    const uint32_t flags = GTP_GRAD_BUFFER_UNINITIALIZED | GTP_GRAD_BUFFER_SEPARATE;
    for (int microbatch = 0; microbatch < 2; ++microbatch) {
      gtp_grad_buffer_t buffer = GTP_GRAD_BUFFER_INITIALIZER;
      ASSERT_EQ(gtp_grad_buffer_ex(ctx, w, flags, &buffer, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      EXPECT_EQ(buffer.data == main_grad.data(), microbatch == 0);
      EXPECT_EQ(buffer.overwrite, 1);
      if (microbatch == 0) {
        EXPECT_EQ(gtp_main_grads_zeroed(ctx, &w, 1), GTP_ERROR_INVALID_STATE);
        EXPECT_NE(std::string(gtp_last_error(ctx)).find("drain first"), std::string::npos) << gtp_last_error(ctx);
      }
      for (int64_t i = 0; i < kRows * kCols; ++i) buffer.data[i] = static_cast<float>(i % 13) + microbatch;
      ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    EXPECT_EQ(gtp_main_grads_zeroed(ctx, &w, 1), GTP_ERROR_INVALID_STATE);  // microbatch 1's add is pending
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    for (int64_t i = 0; i < kRows * kCols; ++i) ASSERT_EQ(main_grad[i], 2.0f * static_cast<float>(i % 13) + 1.0f) << i;
    const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
    EXPECT_EQ(stats.at("grads").at("zeroed_handouts").get<int>(), 1) << stats;
    EXPECT_EQ(stats.at("grads").at("reduce_scatters").get<int>(), 1) << stats;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbi, ExpertGroupMaterializesEveryExpertAfterItsLeader) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);  // no profile: G = EG = 2
    ASSERT_NE(ctx, nullptr);
    std::vector<std::vector<uint16_t>> shards(2, std::vector<uint16_t>(32 * kCols));
    gtp_weight_t experts[2];
    for (int e = 0; e < 2; ++e) {
      for (int64_t r = 0; r < 32 && rank * 32 + r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) shards[e][r * kCols + c] = static_cast<uint16_t>(full_weight(rank * 32 + r, c) + e);
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = e == 0 ? "expert0" : "expert1";
      desc.shard = shards[e].data();
      desc.rows = kRows;
      desc.cols = kCols;
      desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
      desc.expert_leader = e == 0 ? nullptr : &experts[0];
      ASSERT_EQ(gtp_weight_register(ctx, &desc, &experts[e]), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_weights_shard_updated(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptrs[2] = {nullptr, nullptr};
    size_t count = 0;
    EXPECT_GTP_ERROR(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "expand to 2");
    ASSERT_EQ(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr),
              GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(count, 2u);
    for (int e = 0; e < 2; ++e) {
      const auto* full = static_cast<const uint16_t*>(ptrs[e]);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(full[r * kCols + c], full_weight(r, c) + e) << e << ":" << r;
    }
    ASSERT_EQ(gtp_release(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbi, CreateRefusesBadConfigurationsAndLeavesTheOutputUntouched) {
  auto group = gtp::comm::ThreadBootstrap::create_group(2, kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_t* const sentinel = reinterpret_cast<gtp_context_t*>(0x1);
  gtp_context_t* out = sentinel;
  auto attempt = [&](const std::function<void(gtp_context_config_t&)>& edit) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    edit(config);
    return gtp_context_create(&config, &out);
  };
  EXPECT_GTP_ERROR(gtp_context_create(nullptr, &out), GTP_ERROR_INVALID_ARGUMENT, nullptr, "config is NULL");
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  EXPECT_GTP_ERROR(gtp_context_create(&config, nullptr), GTP_ERROR_INVALID_ARGUMENT, nullptr, "out is NULL");
  // A size that is no layout's (size - 8 and size - 16 are the 0.7.1 and 0.7.0 layouts, accepted).
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.struct_size -= 4; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "gtp_context_config_t.struct_size");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version += 100; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 0.8 but this libgtp is 0.7");
  // 0.7 added the group ranks at the end of gtp_sizes_t
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version -= 100; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 0.6 but this libgtp is 0.7");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version += 10000; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 1.7");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.timeout_ms = 0; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "timeout_ms");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.backend = static_cast<gtp_backend_t>(9); }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "backend 9 is unknown");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.callbacks = nullptr; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "callbacks is NULL");
  gtp_bootstrap_callbacks_t broken = callbacks;
  broken.allgather = nullptr;
  EXPECT_GTP_ERROR(attempt([&](gtp_context_config_t& c) { c.callbacks = &broken; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "allgather");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.bootstrap = static_cast<gtp_bootstrap_kind_t>(5); }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "bootstrap 5 is unknown");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_json = "{not json"; }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "parse error");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_json = "{}", c.profile_path = "p.json"; }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "give at most one");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_path = "/nonexistent/profile.json"; }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "profile.json");
  const std::string four = profile_json(4, 4);
  EXPECT_GTP_ERROR(attempt([&](gtp_context_config_t& c) { c.profile_json = four.c_str(); }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "world_size is 4 but the bootstrap has 2");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.prefetch_depth = 65; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "prefetch_depth is 65; give 0..64 or GTP_FROM_PROFILE");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.memory_budget_bytes = -2; }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "memory_budget_bytes is -2");
  EXPECT_EQ(out, sentinel);
  EXPECT_EQ(gtp_context_destroy(nullptr), GTP_SUCCESS);
  EXPECT_STREQ(gtp_status_string(GTP_ERROR_TIMEOUT), "GTP_ERROR_TIMEOUT");
  EXPECT_STREQ(gtp_status_string(static_cast<gtp_status_t>(42)), "unknown gtp_status_t");
}

// call_timeout_ms: refused below 0; a caller built against the 0.7.0 header (whose struct ends before
// it) is still accepted.
TEST(CAbi, CallTimeoutIsCheckedAndThe070ConfigLayoutIsAccepted) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.call_timeout_ms = -1;
  gtp_context_t* ctx = nullptr;
  EXPECT_GTP_ERROR(gtp_context_create(&config, &ctx), GTP_ERROR_INVALID_ARGUMENT, nullptr, "call_timeout_ms is -1");
  config.struct_size = offsetof(gtp_context_config_t, call_timeout_ms);  // -1 beyond it is not read
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  EXPECT_EQ(gtp_context_check(ctx), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

// sum_grads, appended after 0.7.1: a caller built against the 0.7.1 header (whose struct ends before
// it) is accepted with it taken as 0, and a struct_size between the known layouts is refused.
TEST(CAbi, The071ConfigLayoutIsAcceptedWithoutSumGrads) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.sum_grads = 1;
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  config.struct_size = offsetof(gtp_context_config_t, sum_grads);
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  config.struct_size = offsetof(gtp_context_config_t, sum_grads) + 1;
  EXPECT_GTP_ERROR(gtp_context_create(&config, &ctx), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "gtp_context_config_t.struct_size is");
}

TEST(CAbi, BootstrapFailuresMapToTimeoutAndSystem) {
  for (gtp_bootstrap_result_t result : {GTP_BOOTSTRAP_TIMEOUT, GTP_BOOTSTRAP_ERROR}) {
    gtp_bootstrap_callbacks_t callbacks{};
    callbacks.struct_size = sizeof(callbacks);
    callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
    callbacks.world_size = 2;
    callbacks.user_data = &result;
    callbacks.allgather = [](void* u, const void*, void*, size_t, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.broadcast = [](void* u, void*, size_t, int32_t, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.barrier = [](void* u, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.last_error = [](void*) { return "the store is gone"; };
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    gtp_context_t* out = nullptr;
    EXPECT_GTP_ERROR(gtp_context_create(&config, &out),
                     result == GTP_BOOTSTRAP_TIMEOUT ? GTP_ERROR_TIMEOUT : GTP_ERROR_SYSTEM, nullptr, "the store is gone");
    EXPECT_EQ(out, nullptr);
  }
}

TEST(CAbi, NullContextIsAnInvalidArgumentForEveryCall) {
  gtp_weight_t w{};
  void* ptr = nullptr;
  float* grad = nullptr;
  size_t n = 0;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  const std::vector<std::function<gtp_status_t()>> calls = {
      [&] { return gtp_context_abort(nullptr); },
      [&] { return gtp_context_sizes(nullptr, &sizes); },
      [&] { return gtp_weight_register(nullptr, &desc, &w); },
      [&] { return gtp_weight_unregister(nullptr, w); },
      [&] { return gtp_weights_shard_updated(nullptr, &w, 1, nullptr); },
      [&] { return gtp_materialize(nullptr, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &n, nullptr); },
      [&] { return gtp_release(nullptr, &w, 1, nullptr); },
      [&] { return gtp_grad_buffer(nullptr, w, &grad, nullptr); },
      [&] { return gtp_finalize(nullptr, &w, 1, 1, nullptr); },
      [&] { return gtp_drain(nullptr, nullptr); },
      [&] { return gtp_reset_chains(nullptr); },
      [&] { return gtp_main_grads_zeroed(nullptr, nullptr, 0); },
      [&] { return gtp_stats_json(nullptr, nullptr, 0, &n); },
      [&] { return gtp_trace_json(nullptr, nullptr, 0, &n); },
  };
  for (const auto& call : calls) EXPECT_GTP_ERROR(call(), GTP_ERROR_INVALID_ARGUMENT, nullptr, "ctx is NULL");
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(grad, nullptr);
  EXPECT_EQ(n, 0u);
}

TEST(CAbi, MisuseReturnsItsStatusAndNamesTheProblem) {
  on_ranks(2, [](int, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string profile = profile_json(2, 2);  // G = 2
    gtp_context_t* ctx = create(callbacks, profile.c_str());
    ASSERT_NE(ctx, nullptr);
    std::vector<uint16_t> shard(32 * kCols, 0x3F80);
    std::vector<float> main_grad(32 * kCols, 0.0f);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "w";
    desc.shard = shard.data();  // 40 rows: rank 0 holds 32, rank 1 holds 8
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad.data();
    const gtp_weight_t untouched{-7, 7};
    gtp_weight_t w = untouched;

    // Registration: null and malformed inputs, unknown enums.
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, nullptr, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "desc is NULL");
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    gtp_weight_desc_t bad = desc;
    bad.struct_size = 8;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_desc_t.struct_size");
    bad = desc;
    bad.group = static_cast<gtp_group_t>(3);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "group 3 is unknown");
    bad = desc;
    bad.wire = static_cast<gtp_wire_t>(9);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "wire 9 is unknown");
    bad = desc;
    bad.dtype = static_cast<gtp_dtype_t>(4);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "dtype 4 is unknown");
    bad = desc;
    bad.rows = 0;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_register: ");
    // The 0.3 fields: a block shape the wire lacks (also through FROM_GROUP: bf16 here), unknown roundings.
    bad = desc;
    bad.wire = GTP_WIRE_FP8;
    bad.nvfp4_2d = 1;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "nvfp4_2d is 1 but the wire is fp8");
    bad.wire = GTP_WIRE_FROM_GROUP;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "nvfp4_2d is 1 but the wire is bf16");
    bad = desc;
    bad.wire = GTP_WIRE_MXFP8;
    bad.mx_rounding = 2;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "mx_rounding 2 is unknown; use GTP_MX_ROUNDING_RCEIL");
    bad.wire = GTP_WIRE_BF16;
    bad.mx_rounding = -1;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "mx_rounding -1 is unknown");
    // An expert's block shape (or rounding) differs from its leader's: the batch is unpacked with one spec.
    gtp_weight_desc_t leader_desc = desc;
    leader_desc.name = "expert0";
    leader_desc.wire = GTP_WIRE_NVFP4;
    leader_desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
    leader_desc.main_grad = nullptr;
    gtp_weight_t leader{};
    ASSERT_EQ(gtp_weight_register(ctx, &leader_desc, &leader), GTP_SUCCESS) << gtp_last_error(ctx);
    bad = leader_desc;
    bad.name = "expert1";
    bad.nvfp4_2d = 1;
    bad.expert_leader = &leader;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "this expert's wire is nvfp4 (2d), the leader's nvfp4 (1d)");
    ASSERT_EQ(gtp_weight_unregister(ctx, leader), GTP_SUCCESS) << gtp_last_error(ctx);
    leader_desc.wire = GTP_WIRE_MXFP8;
    leader_desc.rows = 64;  // MXFP8 shards are 32-row aligned: G = 2 -> two full 32-row shards
    leader_desc.cols = kCols;
    std::vector<uint16_t> mx_shard(32 * kCols, 0x3F80);
    leader_desc.shard = mx_shard.data();
    ASSERT_EQ(gtp_weight_register(ctx, &leader_desc, &leader), GTP_SUCCESS) << gtp_last_error(ctx);
    bad = leader_desc;
    bad.name = "expert1";
    bad.mx_rounding = GTP_MX_ROUNDING_FLOOR;
    bad.expert_leader = &leader;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "this expert's wire is mxfp8 (floor), the leader's mxfp8 (rceil)");
    // ... or its GEMM scale layout: a grouped GEMM reads all experts' scales one way.
    bad.mx_rounding = GTP_MX_ROUNDING_RCEIL;
    bad.gemm_scale_layout = GTP_SCALE_LAYOUT_BLOCKED_128X4;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "this expert asks for blocked 128x4, the leader has row-major");
    ASSERT_EQ(gtp_weight_unregister(ctx, leader), GTP_SUCCESS) << gtp_last_error(ctx);
    // A 0.2 caller's struct is two int32 shorter.
    bad = desc;
    bad.struct_size = offsetof(gtp_weight_desc_t, nvfp4_2d);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_desc_t.struct_size");
    EXPECT_EQ(w.id, untouched.id);
    EXPECT_EQ(w.generation, untouched.generation);
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    sizes.struct_size = 3;
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, &sizes), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_sizes_t.struct_size");
    EXPECT_EQ(sizes.world_size, 0);

    // Materialize and release.
    void* ptrs[2] = {nullptr, nullptr};
    size_t count = 99;
    const gtp_weight_t twice[2] = {w, w};
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, nullptr, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_ptrs is NULL");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, nullptr, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_count is NULL");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 0, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_capacity is 0");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, twice, 2, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "listed twice");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, static_cast<gtp_phase_t>(5), 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "phase 5");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, -1, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "model_chunk is -1; give 0..1023");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, static_cast<gtp_layout_t>(2), ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "layout 2");
    EXPECT_EQ(ptrs[0], nullptr);
    EXPECT_EQ(count, 99u);
    EXPECT_GTP_ERROR(gtp_release(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "release");
    ASSERT_EQ(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr), GTP_SUCCESS)
        << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, w), GTP_ERROR_INVALID_STATE, ctx, "is materialized");
    ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_release(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "release");
    EXPECT_GTP_ERROR(gtp_release(ctx, nullptr, 1, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "ws is NULL");

    // Gradients.
    float* grad = nullptr;
    EXPECT_GTP_ERROR(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "has no grad buffer");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, w, nullptr, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    ASSERT_EQ(gtp_grad_buffer(ctx, w, &grad, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_finalize(ctx, twice, 2, 1, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "listed twice");
    ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    // Stats into a short buffer: nothing written, *len is the length needed.
    char small[4] = {'x', 'x', 'x', 'x'};
    size_t len = 0;
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, small, sizeof(small), &len), GTP_ERROR_INVALID_ARGUMENT, ctx, "needs");
    EXPECT_GT(len, sizeof(small));
    EXPECT_EQ(small[0], 'x');
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, nullptr, 5, &len), GTP_ERROR_INVALID_ARGUMENT, ctx, "buf is NULL");
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, small, sizeof(small), nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "len is NULL");

    // Unregister: later uses of the handle are stale.
    ASSERT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, w), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, w, &grad, nullptr), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    const gtp_weight_t from_old_context = w;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);

    // A handle of a destroyed context, used on a new one.
    ctx = create(callbacks, profile.c_str());
    ASSERT_NE(ctx, nullptr);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, from_old_context), GTP_ERROR_INVALID_STATE, ctx,
                     "another context, one since destroyed");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, from_old_context, &grad, nullptr), GTP_ERROR_INVALID_STATE, ctx,
                     "one since destroyed");
    desc.expert_leader = &from_old_context;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, &w), GTP_ERROR_INVALID_STATE, ctx, "one since destroyed");
    EXPECT_EQ(gtp_weight_unregister(ctx, gtp_weight_t{}), GTP_ERROR_INVALID_STATE);

    // Abort: every later call but destroy fails.
    EXPECT_EQ(gtp_context_abort(ctx), GTP_SUCCESS);
    EXPECT_GTP_ERROR(gtp_drain(ctx, nullptr), GTP_ERROR_INVALID_STATE, ctx, "aborted");
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, &sizes), GTP_ERROR_INVALID_STATE, ctx, "aborted");
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

}  // namespace

// One rank of a training run on a TP x G x DP grid through the C ABI, shared by the thread-rank test
// (gtp_groups_test) and the process-rank worker (gtp_groups_worker): every rank registers the shard of
// its TP slice's weights (different per gtp_remat group, so a rank gathering over the wrong group
// fails the byte check), trains kSteps steps and checks main grads against the group's
// reduce-scatter computed here, and the profile's per-group depth and budget in the stats.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "gtp/gtp.h"

namespace gtp::cabi_test {

constexpr int64_t kRows = 40, kCols = 32;  // TP-local; BF16 shards of G = 2 hold 32 rows, of 4 hold 16
constexpr int kWeights = 3;                // a chain long enough to prefetch on
constexpr int kSteps = 2;                  // the first step records the chain, the second prefetches

// BF16 bits of element (r, c) of weight k of gtp_remat group `group`: distinct per group and weight.
inline uint16_t element(int group, int k, int64_t r, int64_t c) {
  return static_cast<uint16_t>(0x3F80 + 0x80 * group + 0x10 * k + (r * kCols + c) % 13);
}

// What rank `g` of its group writes into weight k's grad buffer at full-weight row r.
inline float grad_value(int group, int g, int k, int64_t r) { return static_cast<float>(100 * group + (g + 1) * (r + 1) + k); }

// This rank's coordinates in the dense grid (tp fastest, then gtp_remat, then dp: Megatron's order).
struct Coords {
  int tp, g, dp;
  int group(int tp_size) const { return tp + tp_size * dp; }  // which gtp_remat group
};
inline Coords coords_of(int rank, int tp, int g) { return {rank % tp, rank / tp % g, rank / (tp * g)}; }

inline gtp_context_t* create(const gtp_bootstrap_callbacks_t& callbacks, const std::string& profile, int32_t depth) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.profile_json = profile.c_str();
  config.prefetch_depth = depth;
  gtp_context_t* ctx = nullptr;
  EXPECT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  return ctx;
}

struct Grid {
  int world, tp, g, dp;
  nlohmann::json groups;                 // the profile's "groups" section, or null
  int32_t config_depth;                  // gtp_context_config_t.prefetch_depth
  int expected_depth;                    // of gtp_remat
  int64_t expected_budget;
};

inline std::string grid_profile(const Grid& grid) {
  return profile_with(grid.world,
                      {{"tensor_model_parallel_size", grid.tp}, {"tensor_parallel_num_weight_shards", grid.tp * grid.g}},
                      grid.groups);
}

// On one rank of the grid: kSteps training steps over kWeights weights of the rank's TP slice on the
// rank's gtp_remat group, then destroys ctx.
inline void train_rank(gtp_context_t* ctx, int rank, const Grid& grid) {
  const Coords at = coords_of(rank, grid.tp, grid.g);
  const int group = at.group(grid.tp);
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_EQ(sizes.tp, grid.tp);
  EXPECT_EQ(sizes.gtp_remat, grid.g);
  EXPECT_EQ(sizes.dp, grid.dp);
  EXPECT_EQ(sizes.data_parallel_count, grid.dp * grid.g);
  EXPECT_EQ(sizes.data_parallel_index, at.g + grid.g * at.dp);

  const int64_t shard_rows = grid.g == 2 ? 32 : 16;
  const int64_t first = at.g * shard_rows;
  const int64_t valid = std::max<int64_t>(0, std::min(shard_rows, kRows - first));
  std::vector<std::vector<uint16_t>> shards(kWeights, std::vector<uint16_t>(std::max<int64_t>(valid, 1) * kCols));
  std::vector<std::vector<float>> main_grads(kWeights, std::vector<float>(shards[0].size(), 1.0f));
  std::vector<gtp_weight_t> ws(kWeights);
  const std::string names[kWeights] = {"qkv", "proj", "fc1"};
  for (int k = 0; k < kWeights; ++k) {
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shards[k][r * kCols + c] = element(group, k, first + r, c);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = names[k].c_str();
    desc.shard = valid > 0 ? shards[k].data() : nullptr;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grads[k].data();
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &ws[k]), GTP_SUCCESS) << gtp_last_error(ctx);
  }
  ASSERT_EQ(gtp_weights_shard_updated(ctx, ws.data(), ws.size(), nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

  auto use = [&](int k, gtp_phase_t phase) {
    void* ptr = nullptr;
    size_t count = 0;
    ASSERT_EQ(gtp_materialize(ctx, &ws[k], 1, phase, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
        << gtp_last_error(ctx);
    const auto* full = static_cast<const uint16_t*>(ptr);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < kCols; ++c)
        ASSERT_EQ(full[r * kCols + c], element(group, k, r, c)) << "rank " << rank << " weight " << k << " at " << r << "," << c;
    if (phase == GTP_PHASE_BACKWARD) {
      float* grad = nullptr;
      ASSERT_EQ(gtp_grad_buffer(ctx, ws[k], &grad, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) grad[r * kCols + c] = grad_value(group, at.g, k, r);
    }
    ASSERT_EQ(gtp_release(ctx, &ws[k], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  };
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < kWeights; ++k) use(k, GTP_PHASE_FORWARD);
    for (int k = kWeights - 1; k >= 0; --k) {
      use(k, GTP_PHASE_BACKWARD);
      ASSERT_EQ(gtp_finalize(ctx, &ws[k], 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  }
  // Main grad: 1 + kSteps x the mean over the group's G ranks of what each wrote for the row.
  for (int k = 0; k < kWeights; ++k) {
    for (int64_t r = 0; r < valid; ++r) {
      float sum = 0;
      for (int g = 0; g < grid.g; ++g) sum += grad_value(group, g, k, first + r);
      const float expected = 1.0f + kSteps * (sum / grid.g);
      for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(main_grads[k][r * kCols + c], expected) << k << ":" << r;
    }
  }
  const nlohmann::json stats = stats_of(ctx);
  const nlohmann::json& dense = stats.at("groups").at(GTP_GROUP_GTP_REMAT);
  EXPECT_EQ(dense.at("name"), "gtp_remat") << stats;
  EXPECT_EQ(dense.at("depth").get<int>(), grid.expected_depth) << stats;
  EXPECT_EQ(dense.at("budget_bytes").get<int64_t>(), grid.expected_budget) << stats;
  // The expert group (no expert weights here): the config's depth when it sets one, else its own
  // profile group's (the default 1 when the profile does not mention expt_gtp_remat).
  const nlohmann::json& expert = stats.at("groups").at(GTP_GROUP_EXPERT_GTP_REMAT);
  EXPECT_EQ(expert.at("name"), "expt_gtp_remat") << stats;
  EXPECT_EQ(expert.at("depth").get<int>(), grid.config_depth != GTP_FROM_PROFILE ? grid.config_depth : 1) << stats;
  const int64_t hits = stats.at("materialize").at("prefetch_hits").get<int64_t>();
  if (grid.expected_depth > 0) {
    EXPECT_GT(hits, 0) << stats;
  } else {
    EXPECT_EQ(hits, 0) << stats;
  }
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

}  // namespace gtp::cabi_test

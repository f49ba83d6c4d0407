// The C ABI on grid sub-groups of the host backend, thread ranks over real UCX HostComms: TP x G x DP
// grids from a profile, each rank gathering its TP slice's weight over its own gtp_remat group (the
// groups hold different weights, so a rank gathering over the wrong group fails the byte check), main
// grads against the reduce-scatter computed here, an expert group whose size differs from G, the
// profile's per-group prefetch depth, memory budget and wire format, and bad profiles.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/grid_training.h"
#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "topology/arithmetic.h"

namespace {

using gtp::cabi_test::create;
using gtp::cabi_test::element;
using gtp::cabi_test::Grid;
using gtp::cabi_test::kCols;
using gtp::cabi_test::kRows;
using gtp::cabi_test::on_ranks;
using gtp::cabi_test::profile_with;
using gtp::cabi_test::stats_of;

void train_on_grid(const Grid& grid) {
  const std::string profile = gtp::cabi_test::grid_profile(grid);
  on_ranks(grid.world, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, grid.config_depth);
    ASSERT_NE(ctx, nullptr);
    gtp::cabi_test::train_rank(ctx, rank, grid);
  });
}

TEST(CAbiGroups, World4Tp2G2) {
  // Profile depth 2 and budget, but the config's explicit depth 0 wins over the profile's.
  train_on_grid({4, 2, 2, 1, {{"gtp_remat", {{"prefetch_depth", 2}, {"memory_budget", "1MiB"}}}}, 0, 0, 1 << 20});
}

TEST(CAbiGroups, World8Tp2G2Dp2TakesTheProfilesGroupSettings) {
  train_on_grid({8, 2, 2, 2, {{"gtp_remat", {{"prefetch_depth", 2}, {"memory_budget", "1MiB"}}}}, GTP_FROM_PROFILE, 2,
                 1 << 20});
}

TEST(CAbiGroups, WithoutGroupSettingsTheDefaultsApply) {
  train_on_grid({4, 1, 2, 2, nullptr, GTP_FROM_PROFILE, 1, 0});
}

// gtp_sizes_t's group ranks (0.7) against the grid: each rank's position in the members of its TP,
// gtp_remat, expt_gtp_remat and DP groups as the grid lists them (TP 2, G 2, DP 2; ETP 1, EG 4).
TEST(CAbiGroups, SizesGiveEachRankItsPositionInEveryGroup) {
  const std::string profile = profile_with(
      8, {{"tensor_model_parallel_size", 2}, {"tensor_parallel_num_weight_shards", 4},
          {"expert_tensor_parallel_size", 1}, {"expert_tensor_parallel_num_weight_shards", 4}},
      nullptr);
  std::vector<gtp_sizes_t> got(8);
  on_ranks(8, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
    ASSERT_NE(ctx, nullptr);
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
    got[rank] = sizes;
    gtp_sizes_t old = GTP_SIZES_INITIALIZER;  // a 0.6 caller's struct ends before the ranks
    old.struct_size = offsetof(gtp_sizes_t, tp_rank);
    EXPECT_EQ(gtp_context_sizes(ctx, &old), GTP_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  gtp::topology::ParallelConfig parallel;
  parallel.world_size = 8;
  parallel.tensor_model_parallel_size = 2;
  parallel.tensor_parallel_num_weight_shards = 4;
  parallel.expert_tensor_parallel_size = 1;
  parallel.expert_tensor_parallel_num_weight_shards = 4;
  const gtp::topology::HyperCommGrid grid = gtp::topology::make_gtp_grid(gtp::topology::derive_sizes(parallel));
  const auto position = [&](int rank, const char* dim, const std::string& view) {
    const std::vector<int> members = grid.group_of(rank, {dim}, view);
    return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  };
  std::vector<int> seen(4, 0);  // expert ranks 0..3 each twice (two expert groups)
  for (int rank = 0; rank < 8; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(got[rank].rank, rank);
    EXPECT_EQ(got[rank].tp_rank, position(rank, "tp", ""));
    EXPECT_EQ(got[rank].gtp_remat_rank, position(rank, "gtp_remat", ""));
    EXPECT_EQ(got[rank].dp_rank, position(rank, "dp", ""));
    EXPECT_EQ(got[rank].expert_gtp_remat_rank, position(rank, "expt_gtp_remat", gtp::topology::kExpertView));
    ASSERT_GE(got[rank].expert_gtp_remat_rank, 0);
    ASSERT_LT(got[rank].expert_gtp_remat_rank, 4);
    ++seen[got[rank].expert_gtp_remat_rank];
  }
  EXPECT_EQ(got[5].tp_rank, 1);  // rank = tp + 2 gtp_remat + 4 dp
  EXPECT_EQ(got[5].gtp_remat_rank, 0);
  EXPECT_EQ(got[5].dp_rank, 1);
  EXPECT_EQ(got[6].gtp_remat_rank, 1);
  EXPECT_EQ(seen, std::vector<int>(4, 2));
}

// World 4: TP = 2, G = 2 for dense weights; ETP = 1, EG = 4 for experts. The expert group's wire is FP8
// from the profile: a FROM_GROUP expert gathers what an explicit FP8 one does, not the BF16 bytes.
TEST(CAbiGroups, ExpertGroupOfOtherSizeThanGAndItsWireFormat) {
  const std::string profile = profile_with(
      4,
      {{"tensor_model_parallel_size", 2}, {"tensor_parallel_num_weight_shards", 4}, {"expert_tensor_parallel_size", 1},
       {"expert_tensor_parallel_num_weight_shards", 4}},
      {{"expt_gtp_remat", {{"wire_format", "fp8"}, {"memory_budget", "2MiB"}}},
       {"gtp_remat", {{"memory_budget", "1MiB"}}}});
  on_ranks(4, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
    ASSERT_NE(ctx, nullptr);
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(sizes.gtp_remat, 2);
    EXPECT_EQ(sizes.expert_gtp_remat, 4);
    // Expert rank in its group: ETP = EP = 1, so the expert group is the world in rank order.
    const int64_t first = rank * 16;
    const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(16, kRows - first));
    std::vector<uint16_t> shard(16 * kCols);
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shard[r * kCols + c] = element(9, 0, first + r, c);
    const gtp_wire_t wires[3] = {GTP_WIRE_BF16, GTP_WIRE_FROM_GROUP, GTP_WIRE_FP8};
    const char* names[3] = {"expert_bf16", "expert_from_group", "expert_fp8"};
    gtp_weight_t ws[3];
    for (int i = 0; i < 3; ++i) {
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = names[i];
      desc.shard = valid > 0 ? shard.data() : nullptr;
      desc.rows = kRows;
      desc.cols = kCols;
      desc.wire = wires[i];
      desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
      ASSERT_EQ(gtp_weight_register(ctx, &desc, &ws[i]), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    // nvfp4_2d is checked against the wire FROM_GROUP resolves to (fp8 here).
    gtp_weight_desc_t two_d = GTP_WEIGHT_DESC_INITIALIZER;
    two_d.name = "expert_2d";
    two_d.shard = valid > 0 ? shard.data() : nullptr;
    two_d.rows = kRows;
    two_d.cols = kCols;
    two_d.group = GTP_GROUP_EXPERT_GTP_REMAT;
    two_d.nvfp4_2d = 1;
    gtp_weight_t refused{-1, 0};
    EXPECT_EQ(gtp_weight_register(ctx, &two_d, &refused), GTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gtp_last_error(ctx)).find("nvfp4_2d is 1 but the wire is fp8"), std::string::npos)
        << gtp_last_error(ctx);
    EXPECT_EQ(refused.id, -1);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 3, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptrs[3] = {};
    size_t count = 0;
    ASSERT_EQ(gtp_materialize(ctx, ws, 3, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 3, &count, nullptr), GTP_SUCCESS)
        << gtp_last_error(ctx);
    ASSERT_EQ(count, 3u);
    const auto* bf16 = static_cast<const uint16_t*>(ptrs[0]);
    const auto* from_group = static_cast<const uint16_t*>(ptrs[1]);
    const auto* fp8 = static_cast<const uint16_t*>(ptrs[2]);
    bool lossy = false;
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      ASSERT_EQ(bf16[i], element(9, 0, i / kCols, i % kCols)) << i;
      ASSERT_EQ(from_group[i], fp8[i]) << i;
      lossy = lossy || fp8[i] != bf16[i];
    }
    EXPECT_TRUE(lossy) << "FP8 reproduced every BF16 value: the test weight does not tell the wires apart";
    ASSERT_EQ(gtp_release(ctx, ws, 3, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    const nlohmann::json stats = stats_of(ctx);
    // Each group has its own budget from its own profile group.
    EXPECT_EQ(stats.at("groups").at(GTP_GROUP_GTP_REMAT).at("budget_bytes").get<int64_t>(), 1 << 20) << stats;
    EXPECT_EQ(stats.at("groups").at(GTP_GROUP_EXPERT_GTP_REMAT).at("budget_bytes").get<int64_t>(), 2 << 20) << stats;
    const nlohmann::json& weights = stats.at("weights");
    ASSERT_EQ(weights.size(), 3u);
    EXPECT_EQ(weights[1].at("gathered_bytes"), weights[2].at("gathered_bytes")) << stats;
    EXPECT_LT(weights[2].at("gathered_bytes").get<int64_t>(), weights[0].at("gathered_bytes").get<int64_t>()) << stats;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// Dense G = 2 and EG = 1 on 2 ranks: an uninitialized grad buffer of an expert (a size-1 group) is its
// main grad, added into, while the dense weight's is libgtp's own, written and reduce-scattered; the
// main grads get the mean of the dense wgrads and each rank's own expert wgrad.
TEST(CAbiGroups, SizeOneExpertGroupAddsIntoTheMainGradWhileTheDenseGroupReduces) {
  const std::string profile = profile_with(
      2, {{"tensor_parallel_num_weight_shards", 2}, {"expert_tensor_parallel_num_weight_shards", 1}});
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
    ASSERT_NE(ctx, nullptr);
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(sizes.gtp_remat, 2);
    ASSERT_EQ(sizes.expert_gtp_remat, 1);
    const int64_t dense_rows = 32;  // 16 rows per rank, no padding
    std::vector<uint16_t> dense_shard(16 * kCols, 0x3F80), expert_shard(kRows * kCols, 0x3F80);
    std::vector<float> dense_main(16 * kCols, 0.0f), expert_main(kRows * kCols, 0.5f);
    gtp_weight_desc_t dense = GTP_WEIGHT_DESC_INITIALIZER;
    dense.name = "dense";
    dense.shard = dense_shard.data();
    dense.rows = dense_rows;
    dense.cols = kCols;
    dense.main_grad = dense_main.data();
    gtp_weight_desc_t expert = GTP_WEIGHT_DESC_INITIALIZER;
    expert.name = "expert";
    expert.shard = expert_shard.data();
    expert.rows = kRows;
    expert.cols = kCols;
    expert.group = GTP_GROUP_EXPERT_GTP_REMAT;
    expert.main_grad = expert_main.data();
    gtp_weight_t ws[2];
    ASSERT_EQ(gtp_weight_register(ctx, &dense, &ws[0]), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weight_register(ctx, &expert, &ws[1]), GTP_SUCCESS) << gtp_last_error(ctx);
    gtp_grad_buffer_t buffers[2] = {GTP_GRAD_BUFFER_INITIALIZER, GTP_GRAD_BUFFER_INITIALIZER};
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(gtp_grad_buffer_ex(ctx, ws[i], GTP_GRAD_BUFFER_UNINITIALIZED, &buffers[i], nullptr), GTP_SUCCESS)
          << gtp_last_error(ctx);
    }
    EXPECT_EQ(buffers[0].overwrite, 1);
    EXPECT_NE(buffers[0].data, dense_main.data());
    EXPECT_EQ(buffers[1].overwrite, 0);
    EXPECT_EQ(buffers[1].data, expert_main.data());
    const float wgrad = static_cast<float>(2 * (rank + 1));  // rank 0: 2, rank 1: 4
    for (int64_t i = 0; i < dense_rows * kCols; ++i) buffers[0].data[i] = wgrad;
    for (int64_t i = 0; i < kRows * kCols; ++i) buffers[1].data[i] += wgrad;
    ASSERT_EQ(gtp_finalize(ctx, ws, 2, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    for (float g : dense_main) ASSERT_EQ(g, 3.0f);  // the mean of 2 and 4
    for (float g : expert_main) ASSERT_EQ(g, 0.5f + wgrad);  // this rank's own
    const nlohmann::json stats = stats_of(ctx);
    EXPECT_EQ(stats.at("grads").at("reduce_scatters").get<int>(), 1) << stats;
    EXPECT_EQ(stats.at("grads").at("into_main_grad").get<int>(), 1) << stats;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// Profile errors are found before any collective, so one rank of a 2-rank bootstrap suffices.
// A group whose profile wire is nvfp4: FROM_GROUP with nvfp4_2d registers 16x16 tiles.
TEST(CAbiGroups, FromGroupResolvingToNvfp4TakesThe2DBlockShape) {
  const std::string profile =
      profile_with(2, {{"tensor_parallel_num_weight_shards", 2}}, {{"gtp_remat", {{"wire_format", "nvfp4"}}}});
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
    ASSERT_NE(ctx, nullptr);
    const int64_t shard_rows = (kRows / 2 + 15) / 16 * 16;
    const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(shard_rows, kRows - rank * shard_rows));
    std::vector<uint16_t> shard(shard_rows * kCols);
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shard[r * kCols + c] = element(3, 0, rank * shard_rows + r, c);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;  // wire: GTP_WIRE_FROM_GROUP
    desc.name = "w2d";
    desc.shard = valid > 0 ? shard.data() : nullptr;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.nvfp4_2d = 1;
    gtp_weight_t w{};
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
    size_t count = 0;
    ASSERT_EQ(gtp_materialize_views(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, &view, 1, &count, nullptr),
              GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(view.wire, GTP_WIRE_NVFP4);
    EXPECT_EQ(view.nvfp4_2d, 1);
    EXPECT_EQ(view.scale_block_rows, 16);
    EXPECT_NE(view.data_t.ptr, nullptr);
    EXPECT_NE(view.scales_t.ptr, nullptr);
    ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// The profile alone can choose the variants: a FROM_GROUP weight with the descriptor's defaults takes
// the group's 16x16 NVFP4 blocks, or its FLOOR MXFP8 rounding (the same bytes as a weight registered
// with that variant explicitly).
TEST(CAbiGroups, FromGroupTakesTheGroupsBlockShapeAndRounding) {
  const nlohmann::json parallel = {{"tensor_parallel_num_weight_shards", 2}};
  const std::string nvfp4_2d =
      profile_with(2, parallel, {{"gtp_remat", {{"wire_format", "nvfp4"}, {"nvfp4_blocks", "2d"}}}});
  const std::string mxfp8_floor =
      profile_with(2, parallel, {{"gtp_remat", {{"wire_format", "mxfp8"}, {"mx_rounding", "floor"}}}});
  for (const std::string& profile : {nvfp4_2d, mxfp8_floor}) {
    const bool nvfp4 = profile == nvfp4_2d;
    on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
      gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
      ASSERT_NE(ctx, nullptr);
      const int64_t align = nvfp4 ? 16 : 32;
      const int64_t shard_rows = (kRows / 2 + align - 1) / align * align;
      const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(shard_rows, kRows - rank * shard_rows));
      std::vector<uint16_t> shard(shard_rows * kCols);
      // MXFP8: every block holds +-1.875 (BF16 0x3ff0), where FLOOR saturates to 1.75 and RCEIL does not.
      for (int64_t r = 0; r < valid; ++r)
        for (int64_t c = 0; c < kCols; ++c)
          shard[r * kCols + c] = nvfp4 ? element(5, 0, rank * shard_rows + r, c) : ((r + c) % 2 ? 0x3ff0 : 0xbff0);
      gtp_weight_t w[2] = {};
      for (int explicit_variant = 0; explicit_variant < 2; ++explicit_variant) {
        gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;  // wire: GTP_WIRE_FROM_GROUP, 1D, RCEIL
        desc.name = explicit_variant ? "explicit" : "from_group";
        desc.shard = valid > 0 ? shard.data() : nullptr;
        desc.rows = kRows;
        desc.cols = kCols;
        if (explicit_variant) {
          desc.wire = nvfp4 ? GTP_WIRE_NVFP4 : GTP_WIRE_MXFP8;
          if (nvfp4) desc.nvfp4_2d = 1; else desc.mx_rounding = GTP_MX_ROUNDING_FLOOR;
        }
        ASSERT_EQ(gtp_weight_register(ctx, &desc, &w[explicit_variant]), GTP_SUCCESS) << gtp_last_error(ctx);
      }
      ASSERT_EQ(gtp_weights_shard_updated(ctx, w, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      gtp_materialized_t views[2] = {GTP_MATERIALIZED_INITIALIZER, GTP_MATERIALIZED_INITIALIZER};
      size_t count = 0;
      ASSERT_EQ(gtp_materialize_views(ctx, w, 2, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 2, &count, nullptr),
                GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(count, 2u);
      EXPECT_EQ(views[0].nvfp4_2d, nvfp4 ? 1 : 0);
      if (nvfp4) {
        EXPECT_NE(views[0].data_t.ptr, nullptr);
      }
      const size_t data_bytes = static_cast<size_t>(views[0].data.rows * views[0].data.ld) / (nvfp4 ? 2 : 1);
      const size_t scale_bytes = static_cast<size_t>(views[0].scales.rows * views[0].scales.ld);
      EXPECT_EQ(std::memcmp(views[0].data.ptr, views[1].data.ptr, data_bytes), 0);
      EXPECT_EQ(std::memcmp(views[0].scales.ptr, views[1].scales.ptr, scale_bytes), 0);
      ASSERT_EQ(gtp_release(ctx, w, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
    });
  }
}

// Registers one kRows x kCols BF16 weight per entry of `groups` (weight k in groups[k], named
// "dense<k>" or "expert<k>", element(seed, k, row, col)) from this rank's 32 rows of G = 2.
void register_weights(gtp_context_t* ctx, int rank, int seed, const std::vector<gtp_group_t>& groups,
                      std::vector<std::vector<uint16_t>>& shards, std::vector<gtp_weight_t>& ws) {
  const int64_t first = rank * 32, valid = std::min<int64_t>(32, kRows - first);
  shards.assign(groups.size(), std::vector<uint16_t>(32 * kCols));
  ws.assign(groups.size(), gtp_weight_t{});
  for (size_t k = 0; k < groups.size(); ++k) {
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shards[k][r * kCols + c] = element(seed, static_cast<int>(k), first + r, c);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    const std::string name = (groups[k] == GTP_GROUP_GTP_REMAT ? "dense" : "expert") + std::to_string(k);
    desc.name = name.c_str();
    desc.shard = shards[k].data();
    desc.rows = kRows;
    desc.cols = kCols;
    desc.group = groups[k];
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &ws[k]), GTP_SUCCESS) << gtp_last_error(ctx);
  }
}

// One consumer of weight k (registered by register_weights with `seed`): every element checked.
void use_weight(gtp_context_t* ctx, const std::vector<gtp_weight_t>& ws, int seed, int k, gtp_phase_t phase) {
  void* ptr = nullptr;
  size_t count = 0;
  ASSERT_EQ(gtp_materialize(ctx, &ws[k], 1, phase, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
      << gtp_last_error(ctx);
  const auto* full = static_cast<const uint16_t*>(ptr);
  for (int64_t i = 0; i < kRows * kCols; ++i) ASSERT_EQ(full[i], element(seed, k, i / kCols, i % kCols)) << k << " " << i;
  ASSERT_EQ(gtp_release(ctx, &ws[k], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
}

// World 2, G = EG = 2: two dense and two expert weights, interleaved forward and backward for three
// steps, each group prefetching at its own profile depth (once refused: the runtime had one depth).
// Every weight is the same 40 x 32 BF16, so every key fills one 2 x 32-row slot of 4 KiB.
void train_two_groups(const std::string& profile, int32_t config_depth, int dense_depth, int expert_depth,
                      int64_t dense_budget, int64_t expert_budget, int dense_batch = 1) {
  SCOPED_TRACE("dense depth " + std::to_string(dense_depth) + ", expert depth " + std::to_string(expert_depth));
  constexpr int kSteps = 3;
  constexpr int64_t kKeyBytes = 2 * 32 * kCols * 2;
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, config_depth);
    ASSERT_NE(ctx, nullptr);
    std::vector<std::vector<uint16_t>> shards;
    std::vector<gtp_weight_t> ws;  // weights 0, 1 dense; 2, 3 experts
    ASSERT_NO_FATAL_FAILURE(register_weights(
        ctx, rank, 7, {GTP_GROUP_GTP_REMAT, GTP_GROUP_GTP_REMAT, GTP_GROUP_EXPERT_GTP_REMAT, GTP_GROUP_EXPERT_GTP_REMAT},
        shards, ws));
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws.data(), 4, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    auto use = [&](int k, gtp_phase_t phase) { ASSERT_NO_FATAL_FAILURE(use_weight(ctx, ws, 7, k, phase)); };
    for (int step = 0; step < kSteps; ++step) {
      for (int k : {0, 2, 1, 3}) use(k, GTP_PHASE_FORWARD);
      for (int k : {3, 1, 2, 0}) use(k, GTP_PHASE_BACKWARD);
      ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    const nlohmann::json stats = stats_of(ctx);
    const int depths[2] = {dense_depth, expert_depth};
    const int64_t budgets[2] = {dense_budget, expert_budget};
    const int batches[2] = {dense_batch, 1};
    for (int g : {GTP_GROUP_GTP_REMAT, GTP_GROUP_EXPERT_GTP_REMAT}) {
      const nlohmann::json& group = stats.at("groups").at(g);
      EXPECT_EQ(group.at("depth").get<int>(), depths[g]) << stats;
      EXPECT_EQ(group.at("budget_bytes").get<int64_t>(), budgets[g]) << stats;
      EXPECT_EQ(group.at("prefetch_batch").get<int>(), batches[g]) << stats;
      EXPECT_EQ(group.at("prefetch_batches").get<int64_t>() * batches[g], group.at("prefetches").get<int64_t>())
          << stats;
      EXPECT_EQ(group.at("budget_waits").get<int64_t>(), 0) << stats;
      EXPECT_EQ(group.at("materializations").get<int64_t>(), 4 * kSteps) << stats;
      // Four consumes of the group a step: the recording step's on demand, then all prefetched (or,
      // at depth 0, all on demand while the other group prefetches).
      EXPECT_EQ(group.at("exposed_gathers").get<int64_t>(), depths[g] > 0 ? 4 : 4 * kSteps) << stats;
      EXPECT_EQ(group.at("prefetch_hits").get<int64_t>(), depths[g] > 0 ? 4 * (kSteps - 1) : 0) << stats;
      EXPECT_EQ(group.at("slots").get<int64_t>(), std::min(depths[g], 4) + 1) << stats;
      EXPECT_LE(group.at("peak_bytes").get<int64_t>(), (depths[g] + 1) * kKeyBytes) << stats;
      EXPECT_EQ(group.at("slot_bytes").get<int64_t>(), (std::min(depths[g], 4) + 1) * kKeyBytes) << stats;
    }
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbiGroups, EachGroupTakesItsOwnDepthAndBudgetFromTheProfile) {
  const nlohmann::json parallel = {{"tensor_parallel_num_weight_shards", 2},
                                   {"expert_tensor_parallel_num_weight_shards", 2}};
  const std::string dense2_expert0 =
      profile_with(2, parallel, {{"gtp_remat", {{"prefetch_depth", 2}, {"memory_budget", "1MiB"}}},
                                 {"expt_gtp_remat", {{"prefetch_depth", 0}, {"memory_budget", "2MiB"}}}});
  train_two_groups(dense2_expert0, GTP_FROM_PROFILE, 2, 0, 1 << 20, 2 << 20);
  const std::string dense1_expert3 = profile_with(2, parallel, {{"gtp_remat", {{"prefetch_depth", 1}}},
                                                                {"expt_gtp_remat", {{"prefetch_depth", 3}}}});
  train_two_groups(dense1_expert3, GTP_FROM_PROFILE, 1, 3, 0, 0);
  // An explicit config depth sets both groups; the budgets stay each group's own.
  train_two_groups(dense2_expert0, 1, 1, 1, 1 << 20, 2 << 20);
  // The dense group's prefetches in pairs; a config depth of 1 brings that batch down to 1.
  const std::string batched = profile_with(2, parallel, {{"gtp_remat", {{"prefetch_depth", 2}, {"prefetch_batch", 2}}},
                                                         {"expt_gtp_remat", {{"prefetch_depth", 3}}}});
  train_two_groups(batched, GTP_FROM_PROFILE, 2, 3, 0, 0, 2);
  train_two_groups(batched, 1, 1, 1, 0, 0, 1);
}

// World 2, G = 2: a context from `profile` with two dense weights and an expert weight (seed `seed`),
// trained `steps` steps, each re-packing the three weights, the forward consuming 0, 2, 1 and the
// backward 1, 2, 0, every materialized weight compared with the unsharded one. `after_step(ctx, rank,
// step)` runs after each step's drain, `check(stats)` on the final stats, on every rank.
void train_dense_and_expert(const std::string& profile, int seed, int steps,
                            const std::function<void(gtp_context_t*, int, int)>& after_step,
                            const std::function<void(const nlohmann::json&)>& check) {
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks, profile, GTP_FROM_PROFILE);
    ASSERT_NE(ctx, nullptr);
    std::vector<std::vector<uint16_t>> shards;
    std::vector<gtp_weight_t> ws;  // weights 0, 1 dense; 2 an expert
    ASSERT_NO_FATAL_FAILURE(register_weights(
        ctx, rank, seed, {GTP_GROUP_GTP_REMAT, GTP_GROUP_GTP_REMAT, GTP_GROUP_EXPERT_GTP_REMAT}, shards, ws));
    auto use = [&](int k, gtp_phase_t phase) { ASSERT_NO_FATAL_FAILURE(use_weight(ctx, ws, seed, k, phase)); };
    for (int step = 0; step < steps; ++step) {
      ASSERT_EQ(gtp_weights_shard_updated(ctx, ws.data(), 3, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      for (int k : {0, 2, 1}) use(k, GTP_PHASE_FORWARD);
      for (int k : {1, 2, 0}) use(k, GTP_PHASE_BACKWARD);
      ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      if (after_step) after_step(ctx, rank, step);
    }
    check(stats_of(ctx));
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

const nlohmann::json kTwoByTwo = {{"tensor_parallel_num_weight_shards", 2},
                                  {"expert_tensor_parallel_num_weight_shards", 2}};

// The dense group keeping its weights gathered (profile keep_gathered): the forward gathers each
// dense weight (on demand in the recording step, then prefetched), and the backward reads them from
// their kept slots; the expert weight, without keep, prefetches both ways.
TEST(CAbiGroups, KeepGatheredFromTheProfileServesTheBackwardFromTheForwardsSlot) {
  constexpr int kSteps = 3;
  const std::string profile =
      profile_with(2, kTwoByTwo, {{"gtp_remat", {{"prefetch_depth", 1}, {"keep_gathered", true}}},
                                  {"expt_gtp_remat", {{"prefetch_depth", 1}}}});
  train_dense_and_expert(profile, 11, kSteps, {}, [&](const nlohmann::json& stats) {
    const nlohmann::json& dense = stats.at("groups").at(GTP_GROUP_GTP_REMAT);
    const nlohmann::json& experts = stats.at("groups").at(GTP_GROUP_EXPERT_GTP_REMAT);
    EXPECT_TRUE(dense.at("keep_gathered").get<bool>()) << stats;
    EXPECT_FALSE(experts.at("keep_gathered").get<bool>()) << stats;
    EXPECT_EQ(dense.at("kept_hits").get<int64_t>(), 2 * kSteps) << stats;  // every backward
    EXPECT_EQ(dense.at("exposed_gathers").get<int64_t>(), 2) << stats;     // the recording step's forward
    EXPECT_EQ(dense.at("prefetch_hits").get<int64_t>(), 2 * (kSteps - 1)) << stats;
    EXPECT_EQ(experts.at("kept_hits").get<int64_t>(), 0) << stats;
    EXPECT_EQ(experts.at("prefetch_hits").get<int64_t>(), 2 * (kSteps - 1)) << stats;
    EXPECT_EQ(stats.at("materialize").at("kept_hits").get<int64_t>(), 2 * kSteps) << stats;
  });
}

// The dense group's fills kept as graphs (profile fill_graphs; the host backend records a fill's
// calls and makes them again at each launch): every materialized weight is still the unsharded one,
// and after the recording steps the dense fills are launches of recorded graphs.
TEST(CAbiGroups, FillGraphsFromTheProfileRecordEachFillOnceAndLaunchItAfterwards) {
  const std::string profile = profile_with(2, kTwoByTwo, {{"gtp_remat", {{"prefetch_depth", 1}, {"fill_graphs", 64}}},
                                                          {"expt_gtp_remat", {{"prefetch_depth", 1}}}});
  int64_t recordings[2] = {0, 0};  // per rank (the ranks are threads)
  const auto no_new_recordings = [&](gtp_context_t* ctx, int rank, int step) {
    const int64_t now = stats_of(ctx).at("groups").at(GTP_GROUP_GTP_REMAT).at("graph_recordings").get<int64_t>();
    if (step >= 2) EXPECT_EQ(now, recordings[rank]) << "a dense fill recorded again at step " << step;
    recordings[rank] = now;
  };
  train_dense_and_expert(profile, 13, 4, no_new_recordings, [&](const nlohmann::json& stats) {
    const nlohmann::json& dense = stats.at("groups").at(GTP_GROUP_GTP_REMAT);
    const nlohmann::json& experts = stats.at("groups").at(GTP_GROUP_EXPERT_GTP_REMAT);
    EXPECT_EQ(dense.at("fill_graphs_limit").get<int64_t>(), 64) << stats;
    EXPECT_GT(dense.at("fill_graphs").get<int64_t>(), 0) << stats;
    EXPECT_GT(dense.at("graph_fills").get<int64_t>(), dense.at("graph_recordings").get<int64_t>()) << stats;
    EXPECT_EQ(experts.at("fill_graphs_limit").get<int64_t>(), 0) << stats;
    EXPECT_EQ(experts.at("graph_fills").get<int64_t>(), 0) << stats;
  });
}

TEST(CAbiGroups, BadProfilesNameTheValueAndTheFix) {
  auto group = gtp::comm::ThreadBootstrap::create_group(2, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  const nlohmann::json parallel = {{"tensor_parallel_num_weight_shards", 2}};
  const std::string negative_depth = profile_with(2, parallel, {{"expt_gtp_remat", {{"prefetch_depth", -1}}}});
  const std::string deep = profile_with(2, parallel, {{"expt_gtp_remat", {{"prefetch_depth", 65}}}});
  const std::string big_batch =
      profile_with(2, parallel, {{"gtp_remat", {{"prefetch_depth", 2}, {"prefetch_batch", 4}}}});
  const std::string negative_budget = profile_with(2, parallel, {{"expt_gtp_remat", {{"memory_budget", -4096}}}});
  const std::string wire = profile_with(2, parallel, {{"gtp_remat", {{"wire_format", "fp16"}}}});
  const std::string key = profile_with(2, parallel, {{"gtp_remat", {{"prefetch_dept", 2}}}});
  const std::string budget = profile_with(2, parallel, {{"gtp_remat", {{"memory_budget", "lots"}}}});
  const std::string shards = profile_with(2, {{"tensor_model_parallel_size", 2}, {"tensor_parallel_num_weight_shards", 3}});
  gtp_context_t* out = nullptr;
  auto attempt = [&](const std::string& profile, int32_t depth = GTP_FROM_PROFILE) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.profile_json = profile.c_str();
    config.prefetch_depth = depth;
    return gtp_context_create(&config, &out);
  };
  EXPECT_GTP_ERROR(attempt(negative_depth), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "/groups/expt_gtp_remat/prefetch_depth: value -1 is out of range: use 0..64");
  EXPECT_GTP_ERROR(attempt(deep), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "/groups/expt_gtp_remat/prefetch_depth: value 65 is out of range: use 0..64");
  EXPECT_GTP_ERROR(attempt(big_batch), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "/groups/gtp_remat/prefetch_batch: prefetch_batch=4 exceeds prefetch_depth=2; use 1..2");
  EXPECT_GTP_ERROR(attempt(negative_budget), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "/groups/expt_gtp_remat/memory_budget: value -4096 is out of range: use 0..");
  EXPECT_GTP_ERROR(attempt(wire), GTP_ERROR_INVALID_ARGUMENT, nullptr, "/groups/gtp_remat/wire_format");
  EXPECT_GTP_ERROR(attempt(key), GTP_ERROR_INVALID_ARGUMENT, nullptr, "did you mean 'prefetch_depth'");
  EXPECT_GTP_ERROR(attempt(budget), GTP_ERROR_INVALID_ARGUMENT, nullptr, "memory_budget");
  EXPECT_GTP_ERROR(attempt(shards), GTP_ERROR_INVALID_ARGUMENT, nullptr, "tensor_parallel_num_weight_shards");
  EXPECT_EQ(out, nullptr);
}

}  // namespace

// Ranks that disagree (issue 21), on the host backend with thread ranks over the C ABI: each case used
// to succeed on every rank with wrong data (or time out); now every rank fails with
// GTP_ERROR_DIVERGED and one message naming the setting or weight, the call and the differing ranks:
// at the gather itself with check_every_fill, at the step's drain without (the default).
// docs/reliability.md, "Ranks that disagree".
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"

namespace {

using gtp::cabi_test::on_ranks;

constexpr int64_t kRows = 32, kCols = 16;

// Rank `rank`'s rows of weight `k` (G = 2: 16 rows each) as BF16 bits, distinct per weight and row.
std::vector<uint16_t> shard_of(int k, int rank) {
  std::vector<uint16_t> shard(static_cast<size_t>(kRows / 2 * kCols));
  for (size_t i = 0; i < shard.size(); ++i) {
    shard[i] = static_cast<uint16_t>(0x3f80 + k * 0x400 + rank * 0x100 + static_cast<int>(i / kCols));
  }
  return shard;
}

gtp_weight_t register_weight(gtp_context_t* ctx, const char* name, const std::vector<uint16_t>& shard, gtp_wire_t wire) {
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = name;
  desc.shard = shard.data();
  desc.rows = kRows;
  desc.cols = kCols;
  desc.wire = wire;
  gtp_weight_t w{};
  EXPECT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
  return w;
}

gtp_status_t materialize(gtp_context_t* ctx, gtp_weight_t w, void** ptr) {
  size_t count = 0;
  return gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptr, 1, &count, nullptr);
}

// A context that checks every gather before it is unpacked (check_every_fill), EXPECTing success.
gtp_context_t* create_checking_every_fill(const gtp_bootstrap_callbacks_t& callbacks) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.check_every_fill = 1;
  gtp_context_t* ctx = nullptr;
  EXPECT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  return ctx;
}

// Each rank's message, for checks that need every rank's.
struct Messages {
  std::vector<std::string> text;
  explicit Messages(int world) : text(static_cast<size_t>(world)) {}
};

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in: " << text;
}

// The control: ranks that agree round-trip both weights exactly (BF16 bits are copied).
TEST(Diverge, RanksThatAgreeRoundTrip) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16), register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    for (int k = 0; k < 2; ++k) {
      void* ptr = nullptr;
      ASSERT_EQ(materialize(ctx, ws[k], &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
      const auto* got = static_cast<const uint16_t*>(ptr);
      for (int r = 0; r < 2; ++r) {
        const std::vector<uint16_t> want = shard_of(k, r);
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[r * want.size() + i], want[i]) << "w" << k << " rank " << r;
      }
      ASSERT_EQ(gtp_release(ctx, &ws[k], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

class RegisterOrder : public testing::TestWithParam<gtp_wire_t> {};

// Rank 1 registers w1 before w0: its ids (and FP8 amax slots) follow another order. Used to return a
// wrong w0 (FP8: amax reduced across the wrong weights) with success on every rank.
TEST_P(RegisterOrder, IsDetectedAtTheFirstGatherOnEveryRank) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create_checking_every_fill(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    gtp_weight_t w0{}, w1{};
    if (rank == 1) {
      w1 = register_weight(ctx, "w1", s1, GetParam());
      w0 = register_weight(ctx, "w0", s0, GetParam());
    } else {
      w0 = register_weight(ctx, "w0", s0, GetParam());
      w1 = register_weight(ctx, "w1", s1, GetParam());
    }
    const gtp_weight_t ws[2] = {w0, w1};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    EXPECT_EQ(materialize(ctx, w0, &ptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    // The context is spent: later calls are refused, destroy still works.
    EXPECT_EQ(materialize(ctx, w0, &ptr), GTP_ERROR_INVALID_STATE);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  for (const std::string& text : messages.text) {
    expect_contains(text, {"gtp_materialize: ranks of group 'gtp_remat' diverged at a gather (on demand",
                           "rank 0 gathers 'w0' (registration #0 of the group on that rank",
                           "rank 1 gathers 'w0' (registration #1 of the group on that rank",
                           "registered them in a different order", "Nothing was unpacked"});
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, RegisterOrder, testing::Values(GTP_WIRE_BF16, GTP_WIRE_FP8));

// Rank 1 materializes w1 while rank 0 materializes w0 (same shapes): used to succeed with each rank
// holding a weight made of both.
TEST(Diverge, RanksMaterializingDifferentWeightsFailTogether) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create_checking_every_fill(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16), register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    // First as they should (cuda_fill_tags_test follows the same sequence), then each its own.
    ASSERT_EQ(materialize(ctx, ws[0], &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_release(ctx, &ws[0], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(materialize(ctx, ws[rank], &ptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    // The divergence also aborted this rank's communicators (a rank outside the exchange must not
    // wait), without turning a peer's DIVERGED into the abort's SYSTEM.
    EXPECT_EQ(gtp_context_check(ctx), GTP_ERROR_INVALID_STATE);
    expect_contains(gtp_last_error(ctx), {"gtp_materialize failed on rank " + std::to_string(rank),
                                          "diverged at a gather", "libgtp aborted its communicators"});
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  EXPECT_EQ(messages.text[0].substr(messages.text[0].find("): ")), messages.text[1].substr(messages.text[1].find("): ")))
      << "every rank describes the ranks alike";
  for (const std::string& text : messages.text) {
    expect_contains(text, {"gtp_materialize: ", "rank 0 gathers 'w0' (registration #0", "16 bf16",
                           "rank 1 gathers 'w1' (registration #1", "named different weights"});
  }
}

// Over 3 ranks the message groups the ranks that agree: the odd one out is named on every rank.
TEST(Diverge, TheOddRankOutIsNamedOnEveryRank) {
  Messages messages(3);
  on_ranks(3, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create_checking_every_fill(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16), register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    EXPECT_EQ(materialize(ctx, ws[rank == 1 ? 1 : 0], &ptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  for (int rank = 0; rank < 3; ++rank) {
    expect_contains(messages.text[rank], {"this is rank " + std::to_string(rank), "ranks 0, 2 gather 'w0'",
                                          "rank 1 gathers 'w1'"});
  }
}

// Rank 1 registers w0 with the MXFP8 wire, rank 0 with BF16 (neither reduces an amax at its shard
// update, so the ranks' collectives still pair up): their chunks differ in size, and the tag exchange,
// which comes before the weight's own gather, reports it.
TEST(Diverge, AWeightRegisteredWithAnotherWireIsNamed) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create_checking_every_fill(callbacks);
    const std::vector<uint16_t> shard(32 * 32, 0x3f80);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "w0";
    desc.shard = shard.data();
    desc.rows = 64;
    desc.cols = 32;
    desc.wire = rank == 1 ? GTP_WIRE_MXFP8 : GTP_WIRE_BF16;
    gtp_weight_t w0{};
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w0), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    EXPECT_EQ(materialize(ctx, w0, &ptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  // Each rank describes the other's weight as that rank registered it (the tag carries it).
  for (const std::string& text : messages.text) {
    expect_contains(text, {"rank 0 gathers 'w0' (registration #0 of the group on that rank, shard version 1) 64 x 32 bf16",
                           "rank 1 gathers 'w0' (registration #0 of the group on that rank, shard version 1) 64 x 32 mxfp8"});
  }
}

// Rank 1 skips a shard update (BF16: no collective in it): the same weight at other versions.
TEST(Diverge, AShardUpdateMissingOnOneRankIsNamed) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create_checking_every_fill(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank);
    const gtp_weight_t w0 = register_weight(ctx, "w0", s0, GTP_WIRE_BF16);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    if (rank == 0) {
      ASSERT_EQ(gtp_weights_shard_updated(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    void* ptr = nullptr;
    EXPECT_EQ(materialize(ctx, w0, &ptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  for (const std::string& text : messages.text) {
    expect_contains(text, {"rank 0 gathers 'w0' (registration #0 of the group on that rank, shard version 2)",
                           "rank 1 gathers 'w0' (registration #0 of the group on that rank, shard version 1)",
                           "gtp_weights_shard_updated was not called on every rank"});
  }
}

// The default check, once per step at drain: ranks materializing different weights (same shapes)
// succeed until the drain, which fails on every rank naming both weights and the step's check.
class StepCheck : public testing::TestWithParam<gtp_wire_t> {};

TEST_P(StepCheck, RanksMaterializingDifferentWeightsFailTogetherAtDrain) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GetParam()), register_weight(ctx, "w1", s1, GetParam())};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    ASSERT_EQ(materialize(ctx, ws[rank], &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_release(ctx, &ws[rank], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_drain(ctx, nullptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(materialize(ctx, ws[0], &ptr), GTP_ERROR_INVALID_STATE);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  EXPECT_EQ(messages.text[0].substr(messages.text[0].find("): ")), messages.text[1].substr(messages.text[1].find("): ")))
      << "every rank describes the ranks alike";
  for (const std::string& text : messages.text) {
    expect_contains(text, {"gtp_drain: ranks of group 'gtp_remat' diverged at a gather (the step's check at drain",
                           "rank 0 gathers 'w0' (registration #0", "rank 1 gathers 'w1' (registration #1",
                           "named different weights", "The step's gathers were used as they came"});
  }
}

// A shard update missing on one rank: the same weights at other versions, named at the drain.
TEST_P(StepCheck, AShardUpdateMissingOnOneRankIsNamedAtDrain) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank);
    const gtp_weight_t w0 = register_weight(ctx, "w0", s0, GetParam());
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    if (rank == 0 && GetParam() == GTP_WIRE_BF16) {  // FP8 reduces an amax at its update: both ranks must call it
      ASSERT_EQ(gtp_weights_shard_updated(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    void* ptr = nullptr;
    ASSERT_EQ(materialize(ctx, w0, &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_release(ctx, &w0, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_drain(ctx, nullptr), GetParam() == GTP_WIRE_BF16 ? GTP_ERROR_DIVERGED : GTP_SUCCESS)
        << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  if (GetParam() != GTP_WIRE_BF16) return;  // the control: the same calls on every rank pass the check
  for (const std::string& text : messages.text) {
    expect_contains(text, {"rank 0 gathers 'w0' (registration #0 of the group on that rank, shard version 2)",
                           "rank 1 gathers 'w0' (registration #0 of the group on that rank, shard version 1)",
                           "gtp_weights_shard_updated was not called on every rank"});
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, StepCheck, testing::Values(GTP_WIRE_BF16, GTP_WIRE_FP8));

// What the check costs in collectives: by default one tag exchange per group of G > 1 and drain, and
// none at a gather; with check_every_fill one per fill. The data is the same either way.
TEST(Diverge, TheStepCheckIsOneTagCollectivePerDrainAndNonePerGather) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    for (const bool every_fill : {false, true}) {
      gtp_context_t* ctx = every_fill ? create_checking_every_fill(callbacks) : gtp::cabi_test::create(callbacks);
      const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
      const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16),
                                  register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
      ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      constexpr int kSteps = 3;
      for (int step = 0; step < kSteps; ++step) {
        for (int k = 0; k < 2; ++k) {
          void* ptr = nullptr;
          ASSERT_EQ(materialize(ctx, ws[k], &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
          const std::vector<uint16_t> want = shard_of(k, 1);  // rank 1's rows follow rank 0's
          ASSERT_EQ(static_cast<const uint16_t*>(ptr)[want.size()], want[0]) << "w" << k << " step " << step;
          ASSERT_EQ(gtp_release(ctx, &ws[k], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
        }
        ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      }
      const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
      const nlohmann::json& dense = stats.at("groups")[0];  // gtp_remat, G = 2
      const int64_t fills = dense.at("exposed_gathers").get<int64_t>() + dense.at("prefetch_batches").get<int64_t>();
      EXPECT_GT(fills, kSteps) << "as many gathers as drains: the counts below would prove nothing: " << stats;
      EXPECT_EQ(dense.at("tag_checks").get<int64_t>(), every_fill ? fills : kSteps) << stats;
      EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
    }
  });
}

// Gradient accumulation: drains flagged GTP_DRAIN_MIDSTEP leave the check to the step's last drain (one
// tag exchange per step of 3 microbatches, not 3), which still covers the midstep microbatches' gathers.
TEST(Diverge, MidstepDrainsLeaveTheCheckToTheStepsLastDrain) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16), register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_drain_ex(ctx, 4u, nullptr), GTP_ERROR_INVALID_ARGUMENT);
    expect_contains(gtp_last_error(ctx), {"flags 4 has unknown bits", "GTP_DRAIN_MIDSTEP"});
    constexpr int kSteps = 2, kMicrobatches = 3;
    for (int step = 0; step < kSteps; ++step) {
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        for (const gtp_weight_t w : ws) {
          void* ptr = nullptr;
          ASSERT_EQ(materialize(ctx, w, &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
          ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
        }
        ASSERT_EQ(gtp_drain_ex(ctx, mb + 1 == kMicrobatches ? 0u : GTP_DRAIN_MIDSTEP, nullptr), GTP_SUCCESS)
            << gtp_last_error(ctx);
      }
    }
    const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
    EXPECT_EQ(stats.at("groups")[0].at("tag_checks").get<int64_t>(), kSteps) << stats;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// Ranks that materialize different weights in a microbatch whose drain is midstep: that drain passes,
// the step's last drain fails on every rank naming both weights.
TEST(Diverge, ADivergenceBeforeAMidstepDrainFailsAtTheStepsLastDrain) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    const std::vector<uint16_t> s0 = shard_of(0, rank), s1 = shard_of(1, rank);
    const gtp_weight_t ws[2] = {register_weight(ctx, "w0", s0, GTP_WIRE_BF16), register_weight(ctx, "w1", s1, GTP_WIRE_BF16)};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptr = nullptr;
    ASSERT_EQ(materialize(ctx, ws[rank], &ptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_release(ctx, &ws[rank], 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain_ex(ctx, GTP_DRAIN_MIDSTEP, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_drain(ctx, nullptr), GTP_ERROR_DIVERGED) << gtp_last_error(ctx);
    messages.text[rank] = gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
  for (const std::string& text : messages.text) {
    expect_contains(text, {"the step's check at drain", "rank 0 gathers 'w0'", "rank 1 gathers 'w1'"});
  }
}

// Per-rank prefetch_depth 0 / 1 / 2 over 3 ranks: rank 0 used to get 11 of 18 materializations wrong
// and ranks 1-2 timed out. Now create fails on every rank, naming the setting and each rank's value.
TEST(Diverge, PerRankPrefetchDepthFailsCreateOnEveryRank) {
  Messages messages(3);
  on_ranks(3, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.prefetch_depth = rank;
    gtp_context_t* ctx = nullptr;
    EXPECT_EQ(gtp_context_create(&config, &ctx), GTP_ERROR_DIVERGED) << gtp_last_error(nullptr);
    EXPECT_EQ(ctx, nullptr);
    messages.text[rank] = gtp_last_error(nullptr);
  });
  for (const std::string& text : messages.text) {
    EXPECT_EQ(text, messages.text[0]);
    expect_contains(text, {"gtp_context_create: the ranks created their contexts with different settings: ",
                           "groups.gtp_remat.prefetch_depth: 0 on rank 0, 1 on rank 1, 2 on rank 2",
                           "groups.expt_gtp_remat.prefetch_depth: 0 on rank 0, 1 on rank 1, 2 on rank 2"});
    // prefetch_batch follows the depth down, but is 1 on every rank here: not named.
    EXPECT_EQ(text.find("prefetch_batch"), std::string::npos) << text;
  }
}

// One rank reduce-scatters sums, the other means: their main grads would differ by a factor G with
// success everywhere. Create fails on every rank naming sum_grads.
TEST(Diverge, PerRankSumGradsFailsCreateOnEveryRank) {
  Messages messages(2);
  on_ranks(2, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.sum_grads = rank;
    gtp_context_t* ctx = nullptr;
    EXPECT_EQ(gtp_context_create(&config, &ctx), GTP_ERROR_DIVERGED) << gtp_last_error(nullptr);
    messages.text[rank] = gtp_last_error(nullptr);
  });
  for (const std::string& text : messages.text) {
    expect_contains(text, {"different settings: ", "sum_grads: 0 on rank 0, 1 on rank 1"});
  }
}

// Ranks with different profiles (wire format, depth): create used to succeed.
TEST(Diverge, ProfilesThatDifferFailCreateNamingEachSetting) {
  Messages messages(3);
  on_ranks(3, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    const nlohmann::json groups = {
        {"gtp_remat", {{"wire_format", rank == 2 ? "fp8" : "bf16"}, {"prefetch_depth", rank == 2 ? 2 : 1}}}};
    const std::string profile = gtp::cabi_test::profile_with(3, {{"tensor_parallel_num_weight_shards", 3}}, groups);
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.profile_json = profile.c_str();
    gtp_context_t* ctx = nullptr;
    EXPECT_EQ(gtp_context_create(&config, &ctx), GTP_ERROR_DIVERGED) << gtp_last_error(nullptr);
    messages.text[rank] = gtp_last_error(nullptr);
  });
  for (const std::string& text : messages.text) {
    expect_contains(text, {"groups.gtp_remat.prefetch_depth: 1 on ranks 0, 1, 2 on rank 2",
                           "groups.gtp_remat.wire_format: bf16 on ranks 0, 1, fp8 on rank 2"});
    EXPECT_EQ(text.find("expt_gtp_remat"), std::string::npos) << text;
  }
}

}  // namespace

// Hostile input to the C ABI on the host backend: every refusal is a status with a message naming the
// value, and leaves the context as it was (docs/reliability.md).
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"

namespace {

using gtp::cabi_test::callbacks_for;
using gtp::cabi_test::kTimeout;

// One rank (G = 1): the refusals below need no peer.
struct OneRank {
  std::vector<std::unique_ptr<gtp::comm::ThreadBootstrap>> group = gtp::comm::ThreadBootstrap::create_group(1, kTimeout);
  gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
  ~OneRank() { gtp_context_destroy(ctx); }
};

// The weight names in the stats once `w` has been gathered (the stats list gathered weights).
std::vector<std::string> gathered_names(gtp_context_t* ctx, gtp_weight_t w) {
  EXPECT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  void* ptr = nullptr;
  size_t count = 0;
  EXPECT_EQ(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
      << gtp_last_error(ctx);
  EXPECT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  std::vector<std::string> names;
  const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
  for (const auto& entry : stats.at("weights")) names.push_back(entry.at("name"));
  return names;
}

TEST(Hostile, ShapesWhoseByteSizesOverflowAreRefusedAtRegister) {
  OneRank rank;
  std::vector<uint16_t> shard(16 * 16);
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "huge";
  desc.shard = shard.data();
  desc.cols = 16;
  gtp_weight_t w{};
  desc.rows = (int64_t{1} << 60) + 16;  // rows * cols * 2 wraps to a small number
  EXPECT_GTP_ERROR(gtp_weight_register(rank.ctx, &desc, &w), GTP_ERROR_INVALID_ARGUMENT, rank.ctx,
                   "rows=1152921504606846992 x cols=16");
  desc.rows = INT64_MAX - 3;  // padding the rows overflows
  EXPECT_GTP_ERROR(gtp_weight_register(rank.ctx, &desc, &w), GTP_ERROR_INVALID_ARGUMENT, rank.ctx, "exceeds 2^58");
  desc.rows = int64_t{1} << 40;
  desc.cols = int64_t{1} << 40;
  EXPECT_GTP_ERROR(gtp_weight_register(rank.ctx, &desc, &w), GTP_ERROR_INVALID_ARGUMENT, rank.ctx, "check the shape");
  desc.rows = 16;
  desc.cols = 16;
  ASSERT_EQ(gtp_weight_register(rank.ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  EXPECT_EQ(w.id, 0u);  // the refusals took no id
}

TEST(Hostile, NamesThatAreNotUtf8AreRefusedAtRegister) {
  gtp::cabi_test::on_ranks(2, [](int, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = gtp::cabi_test::create(callbacks);
    std::vector<uint16_t> shard(16 * 16);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.shard = shard.data();
    desc.rows = 32;
    desc.cols = 16;
    gtp_weight_t w{};
    for (const char* name : {"fc\xff", "fc\xc0\xaf", "fc\xed\xa0\x80", "fc\xe2\x82", "fc\xf4\x90\x80\x80"}) {
      desc.name = name;
      EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                       "name is not valid UTF-8 (byte 2 of");
    }
    desc.name = "fc\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // é € 😀
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(w.id, 0u);
    EXPECT_EQ(gathered_names(ctx, w), std::vector<std::string>{desc.name});
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// Values that used to become huge allocations (INTERNAL / SYSTEM "bad_alloc") are refused by name.
TEST(Hostile, CountsChunksAndTraceSpansAreBoundedAndNamed) {
  OneRank rank;
  std::vector<uint16_t> shard(16 * 16);
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "w";
  desc.shard = shard.data();
  desc.rows = 16;
  desc.cols = 16;
  gtp_weight_t w{};
  ASSERT_EQ(gtp_weight_register(rank.ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  void* ptr = nullptr;
  size_t count = 0;
  // A huge n: reading stops at the first repeat (a second handle must repeat the only weight).
  const size_t huge = size_t{1} << 62;
  const gtp_weight_t twice[2] = {w, w};
  const std::string named = "weight id 0 is listed twice (n is 4611686018427387904 but 1 weights are registered)";
  EXPECT_GTP_ERROR(gtp_materialize(rank.ctx, twice, huge, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count,
                                   nullptr),
                   GTP_ERROR_INVALID_ARGUMENT, rank.ctx, named);
  EXPECT_GTP_ERROR(gtp_release(rank.ctx, twice, huge, nullptr), GTP_ERROR_INVALID_ARGUMENT, rank.ctx, named);
  EXPECT_GTP_ERROR(gtp_weights_shard_updated(rank.ctx, twice, huge, nullptr), GTP_ERROR_INVALID_ARGUMENT, rank.ctx, named);
  for (int32_t chunk : {100000000, 1024, -1}) {
    EXPECT_GTP_ERROR(gtp_materialize(rank.ctx, &w, 1, GTP_PHASE_FORWARD, chunk, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, rank.ctx, "model_chunk is " + std::to_string(chunk) + "; give 0..1023");
  }
  ASSERT_EQ(gtp_weights_shard_updated(rank.ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  ASSERT_EQ(gtp_materialize(rank.ctx, &w, 1, GTP_PHASE_FORWARD, 1023, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
            GTP_SUCCESS) << gtp_last_error(rank.ctx);
  ASSERT_EQ(gtp_release(rank.ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  ASSERT_EQ(gtp_weight_unregister(rank.ctx, w), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  EXPECT_GTP_ERROR(gtp_release(rank.ctx, twice, huge, nullptr), GTP_ERROR_INVALID_STATE, rank.ctx, "not registered");

  gtp_context_t* out = nullptr;
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &rank.callbacks;
  config.trace_spans = size_t{1} << 62;
  EXPECT_GTP_ERROR(gtp_context_create(&config, &out), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "trace_spans is 4611686018427387904; give 0 (no trace) .. 16777216");
  EXPECT_EQ(out, nullptr);
}

TEST(Hostile, ProfilesAreReadWithBoundedDepthFromRegularFilesOnly) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_t* out = nullptr;
  const auto attempt = [&](const char* json, const char* path) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.profile_json = json;
    config.profile_path = path;
    return gtp_context_create(&config, &out);
  };
  const std::string deep(100000, '[');
  EXPECT_GTP_ERROR(attempt(deep.c_str(), nullptr), GTP_ERROR_INVALID_ARGUMENT, nullptr, "nesting deeper than 64");
  const std::string fifo = std::string(std::getenv("TEST_TMPDIR")) + "/profile.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_GTP_ERROR(attempt(nullptr, fifo.c_str()), GTP_ERROR_INVALID_ARGUMENT, nullptr, "is not a regular file");
  EXPECT_GTP_ERROR(attempt(nullptr, "/dev/zero"), GTP_ERROR_INVALID_ARGUMENT, nullptr, "is not a regular file");
  EXPECT_EQ(out, nullptr);
}

// Found by c_abi_fuzz: materializing before the first shard_updated is call-order misuse, which
// docs/c-abi.md reports as INVALID_STATE; it was INVALID_ARGUMENT.
TEST(Hostile, MaterializeBeforeShardUpdatedIsInvalidState) {
  OneRank rank;
  std::vector<uint16_t> shard(16 * 32);
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "fresh";
  desc.shard = shard.data();
  desc.rows = 16;
  desc.cols = 32;
  gtp_weight_t w{};
  ASSERT_EQ(gtp_weight_register(rank.ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  void* ptr = nullptr;
  size_t count = 0;
  EXPECT_GTP_ERROR(gtp_materialize(rank.ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
                   GTP_ERROR_INVALID_STATE, rank.ctx, "weight 'fresh' was never packed; call gtp_weights_shard_updated");
  gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
  EXPECT_GTP_ERROR(gtp_materialize_views(rank.ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &view, 1, &count, nullptr),
                   GTP_ERROR_INVALID_STATE, rank.ctx, "never packed");
  EXPECT_EQ(ptr, nullptr);  // nothing written
  ASSERT_EQ(gtp_weights_shard_updated(rank.ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(rank.ctx);
  EXPECT_EQ(gtp_materialize(rank.ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
      << gtp_last_error(rank.ctx);
  EXPECT_EQ(gtp_release(rank.ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(rank.ctx);
}

}  // namespace

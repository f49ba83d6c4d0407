// One context, several threads: concurrent and re-entrant calls are refused with INVALID_STATE naming
// the call in progress (never a crash or a corrupted heap), and stats / trace reads from a monitoring
// thread are served. Run under --config=tsan too.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"

namespace {

using gtp::cabi_test::callbacks_for;
using gtp::cabi_test::kTimeout;

constexpr int64_t kRows = 16, kCols = 16;

bool refused_as_busy(gtp_status_t status, gtp_context_t* ctx) {
  return status == GTP_ERROR_INVALID_STATE &&
         std::string(gtp_last_error(ctx)).find("is in progress on this context on another thread") != std::string::npos;
}

struct Weight {
  std::vector<uint16_t> shard = std::vector<uint16_t>(kRows * kCols, 0x3F80);
  std::vector<float> main_grad = std::vector<float>(kRows * kCols, 0.0f);
  gtp_weight_t handle{};
};

void register_weight(gtp_context_t* ctx, Weight& w, const char* name) {
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = name;
  desc.shard = w.shard.data();
  desc.rows = kRows;
  desc.cols = kCols;
  desc.wire = GTP_WIRE_FP8;  // packed and gathered even on one rank: real work under the lock
  desc.main_grad = w.main_grad.data();
  ASSERT_EQ(gtp_weight_register(ctx, &desc, &w.handle), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_weights_shard_updated(ctx, &w.handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
}

// Materialize / release of `w` `rounds` times, each call retried while another thread holds the
// context; any other failure, or a refusal without its message, fails the test.
void cycle(gtp_context_t* ctx, const Weight& w, int rounds, std::atomic<int>* refusals) {
  for (int i = 0; i < rounds; ++i) {
    void* ptr = nullptr;
    size_t count = 0;
    gtp_status_t status;
    while (refused_as_busy(status = gtp_materialize(ctx, &w.handle, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1,
                                                    &count, nullptr),
                           ctx)) {
      ++*refusals;
    }
    ASSERT_EQ(status, GTP_SUCCESS) << gtp_last_error(ctx);
    while (refused_as_busy(status = gtp_release(ctx, &w.handle, 1, nullptr), ctx)) ++*refusals;
    ASSERT_EQ(status, GTP_SUCCESS) << gtp_last_error(ctx);
  }
}

struct OneRank {
  std::vector<std::unique_ptr<gtp::comm::ThreadBootstrap>> group = gtp::comm::ThreadBootstrap::create_group(1, kTimeout);
  gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
};

TEST(Threads, ConcurrentCallsOnOneContextAreRefusedNamingTheCallInProgress) {
  OneRank rank;
  gtp_context_t* ctx = gtp::cabi_test::create(rank.callbacks);
  Weight a, b;
  register_weight(ctx, a, "a");
  register_weight(ctx, b, "b");
  std::atomic<int> refusals{0};
  std::thread other([&] { cycle(ctx, b, 2000, &refusals); });
  cycle(ctx, a, 2000, &refusals);
  other.join();
  // Every call ran exactly once: 4 x 2000 materializations... counted by the runtime.
  const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
  EXPECT_EQ(stats.at("materialize").at("calls").get<int>(), 4000) << stats;
  std::printf("%d calls refused while the other thread's ran\n", refusals.load());
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

TEST(Threads, AMonitoringThreadReadsStatsAndTraceWhileCallsRun) {
  OneRank rank;
  gtp_context_t* ctx = gtp::cabi_test::create(rank.callbacks, nullptr, 256);
  Weight a;
  register_weight(ctx, a, "a");
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::thread monitor([&] {
    std::vector<char> text(1 << 20);
    while (!done.load()) {
      size_t len = 0;
      ASSERT_EQ(gtp_stats_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_NO_THROW(nlohmann::json::parse(text.data()));
      ASSERT_EQ(gtp_trace_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
      gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
      ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
      ++reads;
    }
  });
  std::atomic<int> refusals{0};
  cycle(ctx, a, 2000, &refusals);
  done = true;
  monitor.join();
  EXPECT_EQ(refusals.load(), 0);  // reads wait; they never make a call fail
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

struct Reentry {
  gtp_context_t* ctx = nullptr;
  std::vector<gtp_status_t> statuses;
  std::vector<std::string> messages;
};

TEST(Threads, AGradReadyCallbackCallingIntoItsContextIsRefused) {
  OneRank rank;
  Reentry reentry;
  reentry.ctx = gtp::cabi_test::create(
      rank.callbacks, nullptr, 0,
      [](void* user, gtp_weight_t) {
        auto* r = static_cast<Reentry*>(user);
        r->statuses.push_back(gtp_drain(r->ctx, nullptr));
        r->messages.push_back(gtp_last_error(r->ctx));
        r->statuses.push_back(gtp_context_destroy(r->ctx));  // freeing the context under its own call
        r->messages.push_back(gtp_last_error(nullptr));
      },
      &reentry);
  gtp_context_t* ctx = reentry.ctx;
  Weight a;
  register_weight(ctx, a, "a");
  void* ptr = nullptr;
  size_t count = 0;
  ASSERT_EQ(gtp_materialize(ctx, &a.handle, 1, GTP_PHASE_BACKWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
            GTP_SUCCESS) << gtp_last_error(ctx);
  float* grad = nullptr;
  ASSERT_EQ(gtp_grad_buffer(ctx, a.handle, &grad, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_release(ctx, &a.handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_finalize(ctx, &a.handle, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(reentry.statuses.size(), 2u);
  EXPECT_EQ(reentry.statuses[0], GTP_ERROR_INVALID_STATE);
  EXPECT_NE(reentry.messages[0].find("gtp_drain: gtp_drain was called from inside gtp_"), std::string::npos)
      << reentry.messages[0];
  EXPECT_EQ(reentry.statuses[1], GTP_ERROR_INVALID_STATE);
  EXPECT_NE(reentry.messages[1].find("gtp_context_destroy was called from inside gtp_"), std::string::npos)
      << reentry.messages[1];
  EXPECT_NE(reentry.messages[1].find("not re-entrant"), std::string::npos) << reentry.messages[1];
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);  // the refused destroy left it whole
}

// The CUDA backend runs grad_ready on a host-function thread while gtp_drain waits for it: a read
// from there waiting for the drain would deadlock. Mimicked here by a callback that joins a reader.
TEST(Threads, AReadWaitingForTheCallItBlocksFailsAfterTheTimeout) {
  OneRank rank;
  Reentry reentry;
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &rank.callbacks;
  config.timeout_ms = 300;
  config.grad_ready_user_data = &reentry;
  config.grad_ready = [](void* user, gtp_weight_t) {
    auto* r = static_cast<Reentry*>(user);
    std::thread reader([r] {
      size_t len = 0;
      r->statuses.push_back(gtp_stats_json(r->ctx, nullptr, 0, &len));
      r->messages.push_back(gtp_last_error(r->ctx));
    });
    reader.join();
  };
  ASSERT_EQ(gtp_context_create(&config, &reentry.ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  gtp_context_t* ctx = reentry.ctx;
  Weight a;
  register_weight(ctx, a, "a");
  void* ptr = nullptr;
  size_t count = 0;
  ASSERT_EQ(gtp_materialize(ctx, &a.handle, 1, GTP_PHASE_BACKWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
            GTP_SUCCESS) << gtp_last_error(ctx);
  float* grad = nullptr;
  ASSERT_EQ(gtp_grad_buffer(ctx, a.handle, &grad, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_release(ctx, &a.handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_finalize(ctx, &a.handle, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(reentry.statuses.size(), 1u);
  EXPECT_EQ(reentry.statuses[0], GTP_ERROR_INVALID_STATE);
  EXPECT_NE(reentry.messages[0].find("gtp_stats_json waited timeout_ms=300 for gtp_"), std::string::npos)
      << reentry.messages[0];
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

}  // namespace

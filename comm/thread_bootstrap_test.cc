#include "comm/thread_bootstrap.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>

#include "comm/callback_bootstrap.h"
#include "comm/errors.h"
#include "comm/internal/test_util.h"

namespace gtp::comm {
namespace {

using internal::exercise_bootstrap;
using internal::rethrow_first;
using internal::run_ranks;
using std::chrono::milliseconds;

TEST(ThreadBootstrap, CollectivesDeliverEveryRanksDataForSeveralWorldSizes) {
  for (int n : {1, 2, 3, 5}) {
    auto group = ThreadBootstrap::create_group(n, milliseconds(5000));
    rethrow_first(run_ranks(n, [&](int rank) { exercise_bootstrap(*group[rank]); }));
  }
}

TEST(ThreadBootstrap, MismatchedSizesFailOnEveryRankWithInvalidArgument) {
  auto group = ThreadBootstrap::create_group(3, milliseconds(5000));
  const auto errors = run_ranks(3, [&](int rank) {
    std::vector<char> send(rank == 2 ? 8 : 4), recv(3 * send.size());
    group[rank]->allgather(send.data(), recv.data(), send.size());
  });
  for (const auto& error : errors) {
    ASSERT_TRUE(error);
    try {
      std::rethrow_exception(error);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("same sizes"), std::string::npos) << e.what();
    }
  }
}

TEST(ThreadBootstrap, MissingRankTimesOut) {
  auto group = ThreadBootstrap::create_group(2, milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  try {
    group[0]->barrier();
    FAIL() << "barrier returned without rank 1";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
}

TEST(ThreadBootstrap, RankThatLeavesFailsTheOthersBeforeTheTimeout) {
  auto group = ThreadBootstrap::create_group(3, milliseconds(20000));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int rank) {
    if (rank == 2) {
      group[2].reset();  // this rank "dies"
      return;
    }
    group[rank]->barrier();
  });
  for (int rank : {0, 1}) {
    ASSERT_TRUE(errors[rank]);
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const CommError& e) {
      EXPECT_FALSE(e.timed_out());
      EXPECT_NE(std::string(e.what()).find("rank 2 left"), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
}

TEST(ThreadBootstrap, RejectsBadArguments) {
  EXPECT_THROW(ThreadBootstrap::create_group(0, milliseconds(100)), std::invalid_argument);
  EXPECT_THROW(ThreadBootstrap::create_group(2, milliseconds(0)), std::invalid_argument);
  auto group = ThreadBootstrap::create_group(1, milliseconds(100));
  char byte = 0;
  EXPECT_THROW(group[0]->broadcast(&byte, 1, 1), std::invalid_argument);
}

// A framework's store, as the C vtable sees it: here each rank's callbacks drive a ThreadBootstrap.
struct FakeFrameworkStore {
  ThreadBootstrap* bootstrap;
  bool fail_with_timeout = false;
  std::string error;
};

gtp_bootstrap_result_t run_guarded(FakeFrameworkStore* store, const std::function<void()>& body) {
  if (store->fail_with_timeout) {
    store->error = "store key 'gtp/0' did not appear";
    return GTP_BOOTSTRAP_TIMEOUT;
  }
  try {
    body();
    return GTP_BOOTSTRAP_OK;
  } catch (const std::exception& e) {
    store->error = e.what();
    return GTP_BOOTSTRAP_ERROR;
  }
}

gtp_bootstrap_callbacks_t callbacks_for(FakeFrameworkStore* store) {
  gtp_bootstrap_callbacks_t callbacks{};
  callbacks.struct_size = sizeof(callbacks);
  callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  callbacks.rank = store->bootstrap->rank();
  callbacks.world_size = store->bootstrap->world_size();
  callbacks.user_data = store;
  callbacks.allgather = [](void* user, const void* send, void* recv, size_t bytes, int64_t) {
    auto* s = static_cast<FakeFrameworkStore*>(user);
    return run_guarded(s, [&] { s->bootstrap->allgather(send, recv, bytes); });
  };
  callbacks.broadcast = [](void* user, void* buffer, size_t bytes, int32_t root, int64_t) {
    auto* s = static_cast<FakeFrameworkStore*>(user);
    return run_guarded(s, [&] { s->bootstrap->broadcast(buffer, bytes, root); });
  };
  callbacks.barrier = [](void* user, int64_t) {
    auto* s = static_cast<FakeFrameworkStore*>(user);
    return run_guarded(s, [&] { s->bootstrap->barrier(); });
  };
  callbacks.last_error = [](void* user) { return static_cast<FakeFrameworkStore*>(user)->error.c_str(); };
  return callbacks;
}

TEST(CallbackBootstrap, CollectivesGoThroughTheVtable) {
  auto group = ThreadBootstrap::create_group(3, milliseconds(5000));
  rethrow_first(run_ranks(3, [&](int rank) {
    FakeFrameworkStore store{group[rank].get(), false, ""};
    CallbackBootstrap bootstrap(callbacks_for(&store), milliseconds(5000));
    EXPECT_EQ(bootstrap.rank(), rank);
    EXPECT_EQ(bootstrap.world_size(), 3);
    exercise_bootstrap(bootstrap);
  }));
}

TEST(CallbackBootstrap, FailuresBecomeCommErrorsWithTheStoresDetail) {
  auto group = ThreadBootstrap::create_group(1, milliseconds(5000));
  FakeFrameworkStore store{group[0].get(), false, ""};
  store.fail_with_timeout = true;
  CallbackBootstrap bootstrap(callbacks_for(&store), milliseconds(5000));
  try {
    bootstrap.barrier();
    FAIL() << "barrier should have failed";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_NE(std::string(e.what()).find("store key 'gtp/0' did not appear"), std::string::npos) << e.what();
  }
}

TEST(CallbackBootstrap, RejectsIncompleteVtables) {
  auto group = ThreadBootstrap::create_group(1, milliseconds(5000));
  FakeFrameworkStore store{group[0].get(), false, ""};
  gtp_bootstrap_callbacks_t callbacks = callbacks_for(&store);
  callbacks.barrier = nullptr;
  EXPECT_THROW(CallbackBootstrap(callbacks, milliseconds(100)), std::invalid_argument);
  callbacks = callbacks_for(&store);
  callbacks.struct_size = 8;
  EXPECT_THROW(CallbackBootstrap(callbacks, milliseconds(100)), std::invalid_argument);
  callbacks = callbacks_for(&store);
  callbacks.rank = 1;
  EXPECT_THROW(CallbackBootstrap(callbacks, milliseconds(100)), std::invalid_argument);
  callbacks = callbacks_for(&store);
  callbacks.version = 99;
  EXPECT_THROW(CallbackBootstrap(callbacks, milliseconds(100)), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::comm

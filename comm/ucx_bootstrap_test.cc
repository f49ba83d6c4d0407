// UCX bootstrap on loopback; each rank runs on its own thread with its own UCX context and endpoints.
// The death of a rank's process is covered by the multi-process tests (peer_exit_worker.cc).
#include "comm/ucx_bootstrap.h"

#include <gtest/gtest.h>

#include "comm/errors.h"
#include "comm/internal/loopback_port.h"
#include "comm/internal/test_util.h"

namespace gtp::comm {
namespace {

using internal::exercise_bootstrap;
using internal::rethrow_first;
using internal::run_ranks;
using internal::unused_loopback_port;
using std::chrono::milliseconds;

UcxBootstrapConfig loopback(int rank, int world_size, int port, milliseconds timeout) {
  UcxBootstrapConfig config;
  config.rank = rank;
  config.world_size = world_size;
  config.root_host = "127.0.0.1";
  config.root_port = port;
  config.timeout = timeout;
  return config;
}

// Runs `body` on every rank of a loopback job. `world_size_of(rank)` lets a test give one rank a wrong
// world size.
std::vector<std::exception_ptr> run_job(int world_size, milliseconds timeout,
                                        const std::function<void(UcxBootstrap&)>& body,
                                        const std::function<int(int)>& world_size_of = nullptr) {
  const int port = unused_loopback_port();
  return run_ranks(world_size, [&](int rank) {
    UcxBootstrap bootstrap(loopback(rank, world_size_of ? world_size_of(rank) : world_size, port, timeout));
    body(bootstrap);
  });
}

template <typename Exception>
std::string expect_error(const std::exception_ptr& error) {
  if (!error) {
    ADD_FAILURE() << "expected an exception";
    return "";
  }
  try {
    std::rethrow_exception(error);
  } catch (const Exception& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(UcxBootstrap, CollectivesDeliverEveryRanksData) {
  for (int n : {1, 2, 4}) {
    rethrow_first(run_job(n, milliseconds(20000), [](UcxBootstrap& bootstrap) {
      exercise_bootstrap(bootstrap);
      exercise_bootstrap(bootstrap);  // sequence numbers keep consecutive collectives apart
    }));
  }
}

// A job after a world > 1 job on the same port (gtp-overlap-bench bootstraps every configuration on
// GTP_ROOT_ADDR): the first job's closed connections on the root port sit in TIME_WAIT, and without
// address reuse the second root cannot listen there.
TEST(UcxBootstrap, JobsBackToBackOnOnePortBothBootstrap) {
  const int port = unused_loopback_port();
  for (int job = 0; job < 3; ++job) {
    SCOPED_TRACE("job " + std::to_string(job));
    rethrow_first(run_ranks(2, [&](int rank) {
      UcxBootstrap bootstrap(loopback(rank, 2, port, milliseconds(10000)));
      exercise_bootstrap(bootstrap);
    }));
  }
}

TEST(UcxBootstrap, RootListensOnAFreePortWhenGivenZero) {
  UcxBootstrap bootstrap(loopback(0, 1, 0, milliseconds(2000)));
  EXPECT_GT(bootstrap.root_port(), 0);
}

TEST(UcxBootstrap, UnreachableRootFailsWithinTheTimeout) {
  const int port = unused_loopback_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    UcxBootstrap bootstrap(loopback(1, 2, port, milliseconds(1500)));
    FAIL() << "connected to a root that does not exist";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_TRUE(contains(e.what(), "could not reach rank 0 at 127.0.0.1:" + std::to_string(port))) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
}

TEST(UcxBootstrap, MissingRankMakesTheRootTimeOut) {
  const auto start = std::chrono::steady_clock::now();
  try {
    UcxBootstrap bootstrap(loopback(0, 2, unused_loopback_port(), milliseconds(1000)));
    FAIL() << "the root returned without rank 1";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_TRUE(contains(e.what(), "rank(s) 1 to join")) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(4000));
}

TEST(UcxBootstrap, MismatchedWorldSizeFailsOnBothSides) {
  const auto errors = run_job(2, milliseconds(10000), [](UcxBootstrap&) {},
                              [](int rank) { return rank == 0 ? 2 : 3; });
  EXPECT_TRUE(contains(expect_error<std::invalid_argument>(errors[0]), "world size 3 but rank 0 with 2"));
  EXPECT_TRUE(contains(expect_error<std::invalid_argument>(errors[1]), "world size 3 but rank 0 with 2"));
}

TEST(UcxBootstrap, TwoProcessesClaimingOneRankFail) {
  const int port = unused_loopback_port();
  const auto errors = run_ranks(3, [&](int thread) {
    UcxBootstrap bootstrap(loopback(thread == 0 ? 0 : 1, 3, port, milliseconds(10000)));  // threads 1 and 2 say rank 1
  });
  EXPECT_TRUE(contains(expect_error<std::invalid_argument>(errors[0]), "two processes claim rank 1"));
}

TEST(UcxBootstrap, MismatchedAllgatherSizesFailOnEveryRank) {
  const auto errors = run_job(3, milliseconds(10000), [](UcxBootstrap& bootstrap) {
    std::vector<char> send(bootstrap.rank() == 2 ? 16 : 8), recv(3 * send.size());
    bootstrap.allgather(send.data(), recv.data(), send.size());
  });
  for (const auto& error : errors) {
    const std::string message = expect_error<std::invalid_argument>(error);
    EXPECT_TRUE(contains(message, "rank 2 sent 16 bytes for allgather but rank 0 expected 8")) << message;
  }
}

TEST(UcxBootstrap, ReadsTheEnvironmentWithTorchrunFallbacks) {
  for (const char* name : {"GTP_RANK", "GTP_WORLD_SIZE", "GTP_ROOT_ADDR", "GTP_BOOTSTRAP_TIMEOUT", "RANK",
                           "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
  EXPECT_THROW(UcxBootstrapConfig::from_env(), std::invalid_argument);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29500", 1);
  UcxBootstrapConfig config = UcxBootstrapConfig::from_env();
  EXPECT_EQ(config.rank, 1);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.root_host, "node7");
  EXPECT_EQ(config.root_port, 29500);
  EXPECT_EQ(config.timeout, milliseconds(60000));

  setenv("GTP_RANK", "3", 1);
  setenv("GTP_ROOT_ADDR", "[::1]:1234", 1);
  setenv("GTP_BOOTSTRAP_TIMEOUT", "2.5", 1);
  config = UcxBootstrapConfig::from_env();
  EXPECT_EQ(config.rank, 3);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.root_host, "::1");
  EXPECT_EQ(config.root_port, 1234);
  EXPECT_EQ(config.timeout, milliseconds(2500));

  setenv("GTP_RANK", "4", 1);  // outside the world
  EXPECT_THROW(UcxBootstrapConfig::from_env(), std::invalid_argument);
  setenv("GTP_RANK", "0", 1);
  setenv("GTP_ROOT_ADDR", "no-port", 1);
  EXPECT_THROW(UcxBootstrapConfig::from_env(), std::invalid_argument);
  setenv("GTP_ROOT_ADDR", "127.0.0.1:1", 1);
  setenv("GTP_BOOTSTRAP_TIMEOUT", "soon", 1);
  EXPECT_THROW(UcxBootstrapConfig::from_env(), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::comm

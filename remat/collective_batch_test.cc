// Backend::CollectiveBatch: launched, it ends the backend's batch; left open by an exception, it
// cancels it instead of ending it, and a cancelled batch makes none of its collectives (the backends
// record them until the batch ends: docs/reliability.md, Failing ranks). The host backend's case runs
// two ranks as threads over UCX (HostComm).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "remat/host_backend.h"
#include "testing/remat/logging_backend.h"

namespace gtp::remat {
namespace {

class BatchLoggingBackend : public testing::LoggingBackend {
 protected:
  void begin_collectives() override { log.push_back("begin"); }
  void end_collectives() override { log.push_back("end"); }
  void cancel_collectives() noexcept override { log.push_back("cancel"); }
};

TEST(CollectiveBatch, LaunchEndsTheBatch) {
  BatchLoggingBackend backend;
  {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(backend.side_stream(0, Role::kGather), 0, nullptr, nullptr, 0);
    batch.launch();
  }
  EXPECT_EQ(backend.log, (std::vector<std::string>{"begin", "all_gather on ag0", "end"}));
}

TEST(CollectiveBatch, AnExceptionCancelsTheBatchInsteadOfLaunchingIt) {
  BatchLoggingBackend backend;
  try {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(backend.side_stream(0, Role::kGather), 0, nullptr, nullptr, 0);
    throw std::runtime_error("the second weight's pack failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(backend.log, (std::vector<std::string>{"begin", "all_gather on ag0", "cancel"}));
}

// Rank 0 calls a gather inside a batch, then throws; rank 1 never calls that gather. Both then gather
// once more. A batch that sent its gather at the call would meet rank 1's second gather with the
// cancelled one's bytes, and rank 0's second gather would find nobody (a timeout).
TEST(CollectiveBatch, ACancelledHostBatchSendsNothingToPeers) {
  constexpr std::chrono::milliseconds kTimeout{3000};
  auto bootstraps = comm::ThreadBootstrap::create_group(2, kTimeout);
  std::vector<std::vector<std::int32_t>> got(2);
  comm::internal::rethrow_first(comm::internal::run_ranks(2, [&](int rank) {
    comm::HostComm comm(*bootstraps[rank], kTimeout);
    HostBackend backend({&comm});
    const Stream stream = backend.side_stream(0, Role::kGather);
    std::vector<std::int32_t> recv(2, -1);
    if (rank == 0) {
      const std::int32_t cancelled = 666;
      try {
        Backend::CollectiveBatch batch(backend);
        backend.all_gather(stream, 0, &cancelled, recv.data(), sizeof(std::int32_t));
        throw std::runtime_error("the next weight's pack failed");
      } catch (const std::runtime_error&) {
      }
      EXPECT_EQ(recv, (std::vector<std::int32_t>{-1, -1})) << "the cancelled gather ran";
    }
    const std::int32_t mine = 10 + rank;
    {
      Backend::CollectiveBatch batch(backend);
      backend.all_gather(stream, 0, &mine, recv.data(), sizeof(std::int32_t));
      EXPECT_EQ(recv, (std::vector<std::int32_t>{-1, -1})) << "a batch's gather ran before the batch ended";
      batch.launch();
    }
    got[rank] = recv;
  }));
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(got[rank], (std::vector<std::int32_t>{10, 11})) << "rank " << rank;
}

}  // namespace
}  // namespace gtp::remat

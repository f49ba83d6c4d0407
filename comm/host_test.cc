// HostComm on loopback with ranks as threads of this process, each with its own UCX worker (worker
// addresses travel over a ThreadBootstrap). Multi-process runs: host_multiprocess_test.cc.
#include "comm/host.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "comm/errors.h"
#include "comm/internal/host_checks.h"
#include "comm/internal/ucx_peers.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"

namespace gtp::comm {
namespace {

using internal::rethrow_first;
using internal::run_ranks;
using std::chrono::milliseconds;

void run_host_job(int n, milliseconds timeout, const std::function<void(HostComm&)>& body) {
  auto bootstraps = ThreadBootstrap::create_group(n, timeout);
  rethrow_first(run_ranks(n, [&](int rank) {
    HostComm comm(*bootstraps[rank], timeout);
    body(comm);
  }));
}

TEST(HostComm, CollectivesMatchTheReferenceForOneToThreeRanks) {
  for (int n : {1, 2, 3}) {
    run_host_job(n, milliseconds(30000), [](HostComm& comm) {
      internal::check_all_gather(comm, 11);
      internal::check_reduce_scatter(comm, 12, HostDataType::kFloat32, HostReduceOp::kSum);
      internal::check_reduce_scatter(comm, 13, HostDataType::kBFloat16, HostReduceOp::kMean);
      internal::check_all_reduce_max(comm, 14);
      comm.barrier();
    });
  }
}

TEST(HostComm, MismatchedCountsFailOnEveryRank) {
  run_host_job(3, milliseconds(10000), [](HostComm& comm) { internal::check_mismatched_reduce_scatter_fails(comm); });
}

// A Bootstrap test double for rank 0 of 2 whose peer published `peer_record` and left (a real peer
// cannot be made to leave between the address exchange and the connect, where the race lands).
class DepartedPeerBootstrapDouble : public Bootstrap {
 public:
  explicit DepartedPeerBootstrapDouble(std::string peer_record) : peer_record_(std::move(peer_record)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  // allgather_records calls this twice: the record sizes, then the records padded to the largest.
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override {
    auto* out = static_cast<char*>(recv);
    std::memmove(out, send, bytes_per_rank);
    std::string peer = peer_record_;
    if (calls_++ == 0) {
      const std::uint64_t size = peer_record_.size();
      peer.assign(reinterpret_cast<const char*>(&size), sizeof(size));
    }
    peer.resize(bytes_per_rank);
    std::memcpy(out + bytes_per_rank, peer.data(), bytes_per_rank);
  }
  void broadcast(void*, std::size_t, int) override { ADD_FAILURE() << "HostComm does not broadcast"; }
  void barrier() override { ADD_FAILURE() << "HostComm does not use the bootstrap barrier"; }

 private:
  std::string peer_record_;
  int calls_ = 0;
};

// The connect to a worker that is gone is usually refused at once on loopback, and ucp_ep_create fails.
// With several comm suites running in parallel it succeeded in 1 run of 4, and then the first
// collective must fail instead. Not proven, but likely: the departed worker's TCP listener had a port of
// the ephemeral range, which another process's UCX worker (they open several port-0 listeners each)
// can bind again before the connect. Either way the error names rank 1, well before a hang.
TEST(HostComm, PeerGoneBeforeConnectingIsNamed) {
  std::string departed;
  {
    internal::UcxWorker worker;
    departed = worker.address();
  }
  DepartedPeerBootstrapDouble bootstrap(departed);
  const auto start = std::chrono::steady_clock::now();
  try {
    HostComm comm(bootstrap, milliseconds(2000));
    try {
      comm.barrier();
      ADD_FAILURE() << "a barrier with a rank whose worker is gone returned";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 cannot connect to rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited or crashed"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(10000));
}

TEST(HostComm, MissingPeerTimesOut) {
  auto bootstraps = ThreadBootstrap::create_group(2, milliseconds(10000));
  const auto errors = run_ranks(2, [&](int rank) {
    HostComm comm(*bootstraps[rank], milliseconds(500));
    if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      try {
        comm.barrier();
        ADD_FAILURE() << "barrier returned without rank 1";
      } catch (const CommError& e) {
        EXPECT_TRUE(e.timed_out()) << e.what();
        EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
    }
    // Rank 1 never calls the host barrier; the bootstrap barrier keeps it (and its endpoints) alive
    // until rank 0 has given up.
    bootstraps[rank]->barrier();
  });
  rethrow_first(errors);
}

}  // namespace
}  // namespace gtp::comm

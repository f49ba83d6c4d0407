// One rank of the "peer exits early" test, started by gtp-launch (see host_multiprocess_test.cc).
// After everyone connected, the last rank exits at once (status 0, so the launcher lets the others
// run). Every other rank must then get a CommError naming it, from the host comm and from the
// bootstrap, well within the timeout. Prints "rank R: detected ..." lines and exits 0 when all is well.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "comm/errors.h"
#include "comm/host.h"
#include "comm/ucx_bootstrap.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kTimeout{30};
constexpr std::chrono::seconds kDetectWithin{10};

bool expect_peer_failure(int rank, const char* what, int dead_rank, const std::function<void()>& call) {
  const auto start = Clock::now();
  try {
    call();
  } catch (const gtp::comm::CommError& e) {
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    const bool names_it = std::string(e.what()).find("rank " + std::to_string(dead_rank)) != std::string::npos;
    std::printf("rank %d: detected in %s after %lld ms: %s\n", rank, what, static_cast<long long>(elapsed.count()),
                e.what());
    if (!names_it || e.timed_out() || elapsed > kDetectWithin) {
      std::printf("rank %d: FAILED: the error must name rank %d, not be a timeout, and come within %lld s\n", rank,
                  dead_rank, static_cast<long long>(kDetectWithin.count()));
      return false;
    }
    return true;
  }
  std::printf("rank %d: FAILED: %s returned although rank %d is gone\n", rank, what, dead_rank);
  return false;
}

}  // namespace

int main() {
  gtp::comm::UcxBootstrapConfig config = gtp::comm::UcxBootstrapConfig::from_env();
  config.timeout = kTimeout;
  gtp::comm::UcxBootstrap bootstrap(config);
  gtp::comm::HostComm comm(bootstrap, kTimeout);
  comm.barrier();
  const int dead_rank = comm.size() - 1;
  if (comm.rank() == dead_rank) {
    std::fflush(stdout);
    _exit(0);  // no goodbye: the process is simply gone
  }
  std::vector<float> send(1024, 1.0f), recv(1024 * comm.size());
  const bool host_ok = expect_peer_failure(comm.rank(), "host comm all_gather", dead_rank, [&] {
    comm.all_gather(send.data(), recv.data(), send.size() * sizeof(float));
  });
  const bool bootstrap_ok =
      expect_peer_failure(comm.rank(), "bootstrap barrier", dead_rank, [&] { bootstrap.barrier(); });
  return host_ok && bootstrap_ok ? 0 : 1;
}

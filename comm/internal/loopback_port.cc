#include "comm/internal/loopback_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace gtp::comm::internal {
namespace {

constexpr int kFirstUnprivilegedPort = 1024, kLastPort = 65535;
constexpr int kAttempts = 64;

// Binds 127.0.0.1:port (0: the kernel picks) and returns the port bound, or -1 with errno set.
int try_bind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    bound = ntohs(address.sin_port);
  }
  const int saved = errno;
  close(fd);
  errno = saved;
  return bound;
}

struct PortRange {
  int first, last;
  int size() const { return last >= first ? last - first + 1 : 0; }
};

// The larger stretch of unprivileged ports outside the ephemeral range; empty when the range covers
// them all (or cannot be read, in which case the kernel's pick is as good as any).
PortRange outside_ephemeral_range() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (!(file >> low >> high) || low < 1 || high > kLastPort || low > high) return {1, 0};
  const PortRange below{kFirstUnprivilegedPort, low - 1}, above{high + 1, kLastPort};
  return below.size() >= above.size() ? below : above;
}

}  // namespace

int unused_loopback_port() {
  const PortRange range = outside_ephemeral_range();
  if (range.size() > 0) {
    std::mt19937 generator(std::random_device{}());
    std::uniform_int_distribution<int> pick(range.first, range.last);
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const int port = try_bind(pick(generator));
      if (port > 0) return port;
    }
  }
  const int port = try_bind(0);
  if (port <= 0) {
    throw std::runtime_error(std::string("cannot bind any loopback TCP port: ") + std::strerror(errno));
  }
  return port;
}

}  // namespace gtp::comm::internal

#include "comm/internal/loopback_port.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

namespace gtp::comm::internal {
namespace {

bool can_listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

TEST(LoopbackPort, IsFreeAndOutsideTheEphemeralRange) {
  std::ifstream range_file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  const bool have_range = static_cast<bool>(range_file >> low >> high);
  const bool room_outside = have_range && (low > 1024 || high < 65535);
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    const int port = unused_loopback_port();
    ASSERT_GT(port, 0);
    ASSERT_LE(port, 65535);
    EXPECT_TRUE(can_listen(port)) << "port " << port;
    if (room_outside) EXPECT_TRUE(port < low || port > high) << port << " is in the ephemeral range " << low << "-" << high;
    seen.insert(port);
  }
  EXPECT_GT(seen.size(), 1u) << "every call returned the same port";
}

}  // namespace
}  // namespace gtp::comm::internal

// A loopback TCP port for a job's root to listen on, chosen by gtp-launch and by the bootstrap tests.
#pragma once

namespace gtp::comm::internal {

// A port nobody has bound on 127.0.0.1 right now, outside the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range) when there is room outside it: a port inside that range
// can be handed to any process's outgoing connection or port-0 listener (UCX's own TCP transport
// opens several) between this probe and the root's listen, which then fails with "address in use".
// Throws std::runtime_error naming the cause when no port can be bound.
int unused_loopback_port();

}  // namespace gtp::comm::internal

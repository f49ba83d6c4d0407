#include "topology/internal/test_clusters.h"

#include <cstdio>

namespace gtp::topology::internal {
namespace {

HostTopology switched_host(int gpus, int numa_nodes, double nvswitch_gbytes_per_s, int nics) {
  HostTopology host;
  host.hostname = "template";
  host.source = "test";
  const char* cpusets[2] = {"0x0000ffff", "0xffff0000"};
  for (int n = 0; n < numa_nodes; ++n) {
    host.packages.push_back(Package{n, cpusets[n % 2]});
    host.numa_nodes.push_back(NumaNode{n, cpusets[n % 2], 1ull << 40});
  }
  for (int g = 0; g < gpus; ++g) {
    Gpu gpu;
    gpu.index = g;
    char bus[24];
    std::snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x10 + g);
    gpu.bus_id = bus;
    gpu.numa_node = g * numa_nodes / gpus;
    gpu.cpuset = cpusets[gpu.numa_node % 2];
    gpu.pcie_gbytes_per_s = 63;
    gpu.nvlink.push_back(NvlinkPeer{"nvswitch", "fabric", nvswitch_gbytes_per_s});
    gpu.nvlink_domain = "nvswitch";
    host.gpus.push_back(gpu);
  }
  for (int n = 0; n < nics; ++n) {
    Nic nic;
    nic.name = "mlx5_" + std::to_string(n);
    nic.kind = "infiniband";
    nic.numa_node = n * numa_nodes / nics;
    nic.gbytes_per_s = 50;
    host.nics.push_back(nic);
  }
  return host;
}

}  // namespace

HostTopology dgx_h100_host() { return switched_host(8, 2, 450, 8); }
HostTopology gb200_tray_host() { return switched_host(4, 2, 900, 4); }

Cluster nvl72_cluster(int racks) {
  ClusterTemplate shape;
  shape.host_count = racks * 18;
  shape.hosts_per_nvlink_domain = 18;
  shape.hostname_prefix = "tray";
  shape.host = gb200_tray_host();
  return make_cluster(shape);
}

}  // namespace gtp::topology::internal

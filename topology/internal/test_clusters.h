// Host shapes used by planner tests and the benchmark. Numbers are the vendors' published ones:
// DGX H100 (8 x H100 SXM, 18 NVLink 4.0 links = 450 GB/s per direction to the NVSwitches,
// 8 x ConnectX-7 400 Gb/s = 50 GB/s, 2 NUMA nodes); GB200 NVL72 compute tray (4 x B200,
// 18 NVLink 5.0 links = 900 GB/s per direction, 4 x ConnectX-7 400 Gb/s, 2 Grace NUMA nodes).
#pragma once

#include "topology/topology.h"

namespace gtp::topology::internal {

HostTopology dgx_h100_host();
HostTopology gb200_tray_host();

// n_racks GB200 NVL72 racks of 18 trays each (72 GPUs per NVLink domain).
Cluster nvl72_cluster(int racks);

}  // namespace gtp::topology::internal

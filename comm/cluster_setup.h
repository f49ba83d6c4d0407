// The cluster view of a job and the binding of each rank: every rank discovers its host, the host
// records are gathered over the bootstrap, the planner places the grid from the profile's parallel
// sizes, and each rank learns its slot (host, GPU, NUMA cpuset) and every group's ranks. Then
// bind_rank() selects the GPU and pins the calling thread to the cpuset, reporting what it could not do.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "topology/planner.h"
#include "topology/profile.h"
#include "topology/topology.h"

namespace gtp::comm {

struct ClusterSetupOptions {
  // Produces this rank's host record. Empty: live discovery (topology::discover_local). Tests and
  // replays pass for example [&] { return topology::load_hwloc_xml(path); }.
  std::function<topology::HostTopology()> discover;
};

// Where this process runs. Process ranks are bootstrap ranks, in launcher order (host-major), so
// process p sits on cluster slot p; grid_rank differs from p only when the plan permuted ranks.
struct RankSlot {
  int process_rank = 0;
  int grid_rank = 0;
  int slot = 0;
  int host = 0;           // index into Cluster::hosts()
  std::string hostname;
  int gpu = -1;           // the GPU's index in its host record: the CUDA ordinal when discovered live
  std::string gpu_bus_id;
  int numa_node = -1;
  std::string cpuset;     // hwloc bitmap of the CPUs to bind to ("" unknown)
};

struct ClusterView {
  topology::Cluster cluster;
  topology::Plan plan;
  RankSlot self;
  // Every group of every family of the plan, as lists of PROCESS ranks (ready for NcclComm::split).
  std::map<std::string, std::vector<std::vector<int>>> groups;

  // This process's group in `family`, as process ranks; std::invalid_argument for an unknown family.
  const std::vector<int>& my_group(const std::string& family) const;
};

// Collective over `bootstrap`: every rank calls it, every rank gets the same cluster and plan.
// Throws std::invalid_argument (on every rank alike) when the profile's world size differs from the
// job's, when the hosts have fewer GPUs than ranks, when a rank does not sit on the host its slot
// belongs to (ranks not launched host-major), or when the profile's policy refuses the plan; host
// records that conflict under one hostname are rejected by topology::Cluster::from_records.
ClusterView setup_cluster(Bootstrap& bootstrap, const topology::Profile& profile,
                          const ClusterSetupOptions& options = {});

struct BindResult {
  bool gpu_bound = false;
  std::string gpu;  // what happened: "cudaSetDevice(3)" or why not ("no CUDA device: ...")
  bool cpu_bound = false;
  std::string cpu;  // "bound to 0x0000000f" (with what was left out) or why not
};

// cudaSetDevice(slot.gpu) when a CUDA device is present, and pins the CALLING THREAD to slot.cpuset
// (restricted to the CPUs this process may use) with hwloc_set_cpubind. Never throws for a binding
// that is impossible: the result says what was done.
BindResult bind_rank(const RankSlot& slot);

}  // namespace gtp::comm

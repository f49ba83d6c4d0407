#include "comm/cluster_setup.h"

#include <cuda_runtime_api.h>
#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "topology/discovery.h"

namespace gtp::comm {
namespace {

using topology::Cluster;
using topology::HostTopology;

std::string gpu_counts(const Cluster& cluster) {
  std::string text;
  for (const HostTopology& host : cluster.hosts()) {
    text += (text.empty() ? "" : ", ") + host.hostname + ": " + std::to_string(host.gpus.size());
  }
  return text;
}

// The CPUs to bind a slot to: the GPU's local CPUs, else its NUMA node's.
std::string slot_cpuset(const HostTopology& host, const topology::Gpu& gpu) {
  if (!gpu.cpuset.empty()) return gpu.cpuset;
  for (const topology::NumaNode& node : host.numa_nodes) {
    if (node.os_index == gpu.numa_node) return node.cpuset;
  }
  return "";
}

// Process p runs on host hostnames[p] and sits on slot p: both must agree for every process.
void check_host_major(const Cluster& cluster, const std::vector<std::string>& hostnames) {
  for (std::size_t p = 0; p < hostnames.size(); ++p) {
    const std::string& slot_host = cluster.hosts()[cluster.slot_host(static_cast<int>(p))].hostname;
    if (slot_host != hostnames[p]) {
      throw std::invalid_argument("rank " + std::to_string(p) + " runs on host '" + hostnames[p] + "' but slot " +
                                  std::to_string(p) + " is a GPU of host '" + slot_host +
                                  "': launch ranks host-major (rank = node * gpus_per_node + local_rank) with "
                                  "one rank per GPU, filling each host's GPUs (GPUs per host: " +
                                  gpu_counts(cluster) + ")");
    }
  }
}

std::string violations_text(const topology::Plan& plan) {
  std::string text;
  int listed = 0;
  for (const topology::Violation& violation : plan.violations) {
    if (violation.resolved || ++listed > 3) continue;
    text += "\n  " + violation.group + " group " + std::to_string(violation.group_index) + ": " + violation.reason;
  }
  return text;
}

struct HwlocTopology {
  hwloc_topology_t handle = nullptr;
  HwlocTopology() {
    if (hwloc_topology_init(&handle) != 0) throw std::runtime_error("hwloc_topology_init failed");
    if (hwloc_topology_load(handle) != 0) {
      hwloc_topology_destroy(handle);
      throw std::runtime_error("hwloc_topology_load failed");
    }
  }
  ~HwlocTopology() { hwloc_topology_destroy(handle); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
};

using Bitmap = std::unique_ptr<hwloc_bitmap_s, decltype(&hwloc_bitmap_free)>;

std::string bitmap_text(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_asprintf(&text, set) < 0 || text == nullptr) return "?";
  std::string result(text);
  std::free(text);
  return result;
}

void bind_gpu(const RankSlot& slot, BindResult& result) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    result.gpu = std::string("no CUDA device: ") + (error != cudaSuccess ? cudaGetErrorString(error) : "0 devices");
    return;
  }
  if (slot.gpu < 0 || slot.gpu >= count) {
    result.gpu = "GPU " + std::to_string(slot.gpu) + " is not visible (" + std::to_string(count) +
                 " CUDA devices; check CUDA_VISIBLE_DEVICES)";
    return;
  }
  const cudaError_t set = cudaSetDevice(slot.gpu);
  result.gpu_bound = set == cudaSuccess;
  result.gpu = result.gpu_bound ? "cudaSetDevice(" + std::to_string(slot.gpu) + ")"
                                : "cudaSetDevice(" + std::to_string(slot.gpu) + ") failed: " + cudaGetErrorString(set);
}

void bind_cpu(const RankSlot& slot, BindResult& result) {
  if (slot.cpuset.empty()) {
    result.cpu = "no cpuset known for this slot";
    return;
  }
  try {
    HwlocTopology topology;
    Bitmap wanted(hwloc_bitmap_alloc(), hwloc_bitmap_free), target(hwloc_bitmap_alloc(), hwloc_bitmap_free);
    if (!wanted || !target || hwloc_bitmap_sscanf(wanted.get(), slot.cpuset.c_str()) != 0) {
      result.cpu = "cpuset '" + slot.cpuset + "' is not an hwloc bitmap";
      return;
    }
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topology.handle);
    hwloc_bitmap_and(target.get(), wanted.get(), allowed);
    if (hwloc_bitmap_iszero(target.get())) {
      result.cpu = "cpuset " + slot.cpuset + " has no CPU this process may use (allowed: " + bitmap_text(allowed) + ")";
      return;
    }
    if (hwloc_set_cpubind(topology.handle, target.get(), HWLOC_CPUBIND_THREAD) != 0) {
      result.cpu = "hwloc_set_cpubind(" + bitmap_text(target.get()) + ") failed: " + std::strerror(errno);
      return;
    }
    result.cpu_bound = true;
    result.cpu = "bound to " + bitmap_text(target.get());
    if (!hwloc_bitmap_isequal(target.get(), wanted.get())) {
      result.cpu += " (of " + slot.cpuset + "; the rest is not available to this process)";
    }
  } catch (const std::exception& e) {
    result.cpu = e.what();
  }
}

}  // namespace

const std::vector<int>& ClusterView::my_group(const std::string& family) const {
  const auto found = groups.find(family);
  if (found == groups.end()) {
    throw std::invalid_argument("no group family '" + family + "': use one of the planner's standard groups");
  }
  for (const std::vector<int>& group : found->second) {
    for (int rank : group) {
      if (rank == self.process_rank) return group;
    }
  }
  throw std::invalid_argument("process rank " + std::to_string(self.process_rank) + " is in no " + family + " group");
}

ClusterView setup_cluster(Bootstrap& bootstrap, const topology::Profile& profile, const ClusterSetupOptions& options) {
  const int world = bootstrap.world_size();
  if (profile.sizes.world_size != world) {
    throw std::invalid_argument("the profile's parallel.world_size is " + std::to_string(profile.sizes.world_size) +
                                " but the job has " + std::to_string(world) +
                                " ranks: set parallel.world_size to the number of ranks or launch that many");
  }
  const HostTopology mine = options.discover ? options.discover() : topology::discover_local();
  const std::vector<std::string> records = bootstrap.allgather_records(nlohmann::json(mine).dump());
  std::vector<std::string> hostnames;
  for (const std::string& record : records) hostnames.push_back(nlohmann::json::parse(record).at("hostname"));

  ClusterView view;
  view.cluster = Cluster::from_records(records);
  if (view.cluster.gpu_count() < world) {
    throw std::invalid_argument(std::to_string(world) + " ranks need one GPU each but their hosts have " +
                                std::to_string(view.cluster.gpu_count()) + " (" + gpu_counts(view.cluster) +
                                "): launch at most one rank per GPU");
  }
  check_host_major(view.cluster, hostnames);
  view.plan = topology::make_plan(view.cluster, profile.sizes, profile.on_violation);
  if (!view.plan.ok()) {
    throw std::invalid_argument("the placement breaks " + std::to_string(view.plan.unresolved_violations()) +
                                " rule(s) and placement.on_violation is " + to_string(profile.on_violation) + ":" +
                                violations_text(view.plan) +
                                "\n(see gtp-topo plan; use on_violation warn or permute, or change the sizes)");
  }
  const std::vector<int> by_slot = view.plan.rank_by_slot(view.cluster.gpu_count());
  for (int p = 0; p < world; ++p) {
    if (by_slot[p] < 0) {
      throw std::invalid_argument("the permuted plan leaves slot " + std::to_string(p) + " (rank " +
                                  std::to_string(p) + ") without a grid rank and uses a slot no rank runs on: "
                                  "launch one rank per GPU of every host, or use on_violation warn");
    }
  }
  for (const topology::GroupPlan& family : view.plan.groups) {
    std::vector<std::vector<int>>& lists = view.groups[family.spec.name];
    for (std::vector<int> group : family.groups.to_lists()) {
      for (int& rank : group) rank = view.plan.placement[rank].slot;  // grid rank -> process rank
      lists.push_back(std::move(group));
    }
  }

  RankSlot& self = view.self;
  self.process_rank = bootstrap.rank();
  self.slot = self.process_rank;
  self.grid_rank = by_slot[self.slot];
  self.host = view.cluster.slot_host(self.slot);
  const HostTopology& host = view.cluster.hosts()[self.host];
  const topology::Gpu& gpu = view.cluster.slot(self.slot);
  self.hostname = host.hostname;
  self.gpu = gpu.index;
  self.gpu_bus_id = gpu.bus_id;
  self.numa_node = gpu.numa_node;
  self.cpuset = slot_cpuset(host, gpu);
  return view;
}

BindResult bind_rank(const RankSlot& slot) {
  BindResult result;
  bind_gpu(slot, result);
  bind_cpu(slot, result);
  return result;
}

}  // namespace gtp::comm

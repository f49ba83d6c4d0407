// The topology model: one host's record (packages, NUMA nodes, GPUs, NICs) and the cluster view
// built from every host's record. Records serialize to JSON so the comm layer can allgather them.
//
// Units: bandwidths are GB/s (1e9 bytes/s), unidirectional per GPU; cpusets are hwloc bitmap
// strings ("0x00ff00ff"), so they round-trip through hwloc_bitmap_sscanf.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gtp::topology {

struct Package {
  int os_index = -1;
  std::string cpuset;
};

struct NumaNode {
  int os_index = -1;
  std::string cpuset;
  uint64_t memory_bytes = 0;
};

// One NVLink connection of a GPU. peer_kind: "gpu" (peer is a GPU bus id on this host), "nvswitch"
// (peer is a switch bus id) or "cpu" (peer is "package:<os_index>", e.g. POWER9/Grace NVLink-C2C).
struct NvlinkPeer {
  std::string peer_kind;
  std::string peer;
  double gbytes_per_s = 0;
};

struct Gpu {
  int index = -1;            // CUDA ordinal when discovered live; PCI bus order when replayed from XML
  std::string bus_id;        // "dddd:bb:dd.f", lower-case hex
  std::string model;
  std::string uuid;
  int numa_node = -1;        // os_index of the closest NUMA node, -1 unknown
  std::string cpuset;        // CPUs local to the GPU
  double pcie_gbytes_per_s = 0;  // PCIe link speed, 0 unknown
  std::vector<NvlinkPeer> nvlink;
  // GPUs with equal non-empty domains reach each other over NVLink (a directly linked component on
  // one host, or an NVSwitch fabric clique that may span hosts, e.g. a GB200 NVL72 rack).
  std::string nvlink_domain;

  double nvswitch_gbytes_per_s() const;                       // sum over links to switches
  double nvlink_gbytes_per_s_to(const std::string& peer_bus) const;  // direct GPU-GPU links only
};

struct Nic {
  std::string name;          // OpenFabrics name (mlx5_0) if any, else the network interface name
  std::vector<std::string> interfaces;  // netdev names (ib0, eth0)
  std::string kind;          // "infiniband", "ethernet" or "network"
  std::string bus_id;
  int numa_node = -1;
  double gbytes_per_s = 0;   // link rate, 0 unknown
};

struct HostTopology {
  std::string hostname;
  std::string source;        // "live", "hwloc-xml:<file>" or "profile"
  std::vector<Package> packages;
  std::vector<NumaNode> numa_nodes;
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  std::vector<std::string> notes;  // what discovery could not see, and why
};

// The cluster view. Hosts keep their order; GPUs are numbered host-major ("slots"), which is the
// order launchers use for global ranks (node * gpus_per_node + local_rank).
class Cluster {
 public:
  Cluster() = default;
  // Rejects empty or duplicate hostnames and GPU indices repeated within a host.
  explicit Cluster(std::vector<HostTopology> hosts);
  // From per-rank JSON records as the comm layer gathers them: identical records from ranks on
  // the same host collapse into one; different records under one hostname are an error.
  static Cluster from_records(const std::vector<std::string>& json_records);

  const std::vector<HostTopology>& hosts() const { return hosts_; }
  int gpu_count() const { return static_cast<int>(slot_host_.size()); }
  int slot_host(int slot) const { return slot_host_[slot]; }
  int slot_gpu(int slot) const { return slot_gpu_[slot]; }
  const Gpu& slot(int slot) const { return hosts_[slot_host_[slot]].gpus[slot_gpu_[slot]]; }
  // Dense id of a slot's NVLink domain; GPUs without NVLink get a domain of their own.
  int slot_domain(int slot) const { return slot_domain_[slot]; }
  int domain_count() const { return domain_count_; }

 private:
  std::vector<HostTopology> hosts_;
  std::vector<int> slot_host_, slot_gpu_, slot_domain_;
  int domain_count_ = 0;
};

// A homogeneous cluster: host_count copies of one host shape named <hostname_prefix><index>.
// A template GPU with nvlink_domain D gets "<hostname>/D" when hosts_per_nvlink_domain is 1, and
// "nvl<k>/D" shared by hosts k*n .. k*n+n-1 when it is n > 1 (e.g. 18 GB200 trays per NVL72 rack).
struct ClusterTemplate {
  int host_count = 1;
  int hosts_per_nvlink_domain = 1;
  std::string hostname_prefix = "node";
  HostTopology host;
};
Cluster make_cluster(const ClusterTemplate& shape);

// Strict parse of one host record; errors name the JSON pointer under json_path.
HostTopology parse_host(const nlohmann::json& j, const std::string& json_path);

void to_json(nlohmann::json& j, const NvlinkPeer& v);
void from_json(const nlohmann::json& j, NvlinkPeer& v);
void to_json(nlohmann::json& j, const Package& v);
void from_json(const nlohmann::json& j, Package& v);
void to_json(nlohmann::json& j, const NumaNode& v);
void from_json(const nlohmann::json& j, NumaNode& v);
void to_json(nlohmann::json& j, const Gpu& v);
void from_json(const nlohmann::json& j, Gpu& v);
void to_json(nlohmann::json& j, const Nic& v);
void from_json(const nlohmann::json& j, Nic& v);
void to_json(nlohmann::json& j, const HostTopology& v);
void from_json(const nlohmann::json& j, HostTopology& v);
void to_json(nlohmann::json& j, const Cluster& v);
void from_json(const nlohmann::json& j, Cluster& v);

// Human-readable table of one host (what `gtp-topo probe` prints).
std::string format_host(const HostTopology& host);

}  // namespace gtp::topology

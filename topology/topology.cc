#include "topology/topology.h"

#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <utility>
#include <stdexcept>

#include "topology/internal/json_reader.h"
#include "topology/internal/json_text.h"

namespace gtp::topology {

using internal::JsonReader;
using nlohmann::json;

double Gpu::nvswitch_gbytes_per_s() const {
  double total = 0;
  for (const NvlinkPeer& link : nvlink)
    if (link.peer_kind == "nvswitch") total += link.gbytes_per_s;
  return total;
}

double Gpu::nvlink_gbytes_per_s_to(const std::string& peer_bus) const {
  double total = 0;
  for (const NvlinkPeer& link : nvlink)
    if (link.peer_kind == "gpu" && link.peer == peer_bus) total += link.gbytes_per_s;
  return total;
}

void to_json(json& j, const NvlinkPeer& v) {
  j = json{{"peer_kind", v.peer_kind}, {"peer", v.peer}, {"gbytes_per_s", v.gbytes_per_s}};
}
void to_json(json& j, const Package& v) { j = json{{"os_index", v.os_index}, {"cpuset", v.cpuset}}; }
void to_json(json& j, const NumaNode& v) {
  j = json{{"os_index", v.os_index}, {"cpuset", v.cpuset}, {"memory_bytes", v.memory_bytes}};
}
void to_json(json& j, const Gpu& v) {
  j = json{{"index", v.index},         {"bus_id", v.bus_id},       {"model", v.model},
           {"uuid", v.uuid},           {"numa_node", v.numa_node}, {"cpuset", v.cpuset},
           {"pcie_gbytes_per_s", v.pcie_gbytes_per_s}, {"nvlink", v.nvlink}, {"nvlink_domain", v.nvlink_domain}};
}
void to_json(json& j, const Nic& v) {
  j = json{{"name", v.name},     {"interfaces", v.interfaces}, {"kind", v.kind},
           {"bus_id", v.bus_id}, {"numa_node", v.numa_node},   {"gbytes_per_s", v.gbytes_per_s}};
}
void to_json(json& j, const HostTopology& v) {
  j = json{{"hostname", v.hostname}, {"source", v.source}, {"packages", v.packages}, {"numa_nodes", v.numa_nodes},
           {"gpus", v.gpus},         {"nics", v.nics},     {"notes", v.notes}};
}
void to_json(json& j, const Cluster& v) { j = json{{"hosts", v.hosts()}}; }

namespace {

constexpr int64_t kMaxIndex = 1 << 20;

template <typename T, typename Parse>
std::vector<T> parse_list(const JsonReader& reader, const std::string& key, Parse parse) {
  std::vector<T> out;
  const json* list = reader.optional_array(key);
  if (!list) return out;
  for (size_t i = 0; i < list->size(); ++i) out.push_back(parse((*list)[i], reader.path_of(key) + "/" + std::to_string(i)));
  return out;
}

std::vector<std::string> parse_strings(const JsonReader& reader, const std::string& key) {
  std::vector<std::string> out;
  const json* list = reader.optional_array(key);
  if (!list) return out;
  for (size_t i = 0; i < list->size(); ++i) {
    if (!(*list)[i].is_string()) reader.fail(key, "element " + std::to_string(i) + " is not a string: quote it");
    out.push_back((*list)[i].get<std::string>());
  }
  return out;
}

NvlinkPeer parse_nvlink(const json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"peer_kind", "peer", "gbytes_per_s"});
  return NvlinkPeer{r.choice("peer_kind", "gpu", {"gpu", "nvswitch", "cpu"}), r.required_string("peer"),
                    r.number("gbytes_per_s", 0, 0)};
}

Package parse_package(const json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"os_index", "cpuset"});
  return Package{static_cast<int>(r.integer("os_index", -1, -1, kMaxIndex)), r.string("cpuset", "")};
}

NumaNode parse_numa(const json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"os_index", "cpuset", "memory_bytes"});
  return NumaNode{static_cast<int>(r.required_integer("os_index", 0, kMaxIndex)), r.string("cpuset", ""),
                  static_cast<uint64_t>(r.integer("memory_bytes", 0, 0, INT64_MAX))};
}

Gpu parse_gpu(const json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"index", "bus_id", "model", "uuid", "numa_node", "cpuset", "pcie_gbytes_per_s", "nvlink",
                "nvlink_domain"});
  Gpu gpu;
  gpu.index = static_cast<int>(r.required_integer("index", 0, kMaxIndex));
  gpu.bus_id = r.string("bus_id", "");
  gpu.model = r.string("model", "");
  gpu.uuid = r.string("uuid", "");
  gpu.numa_node = static_cast<int>(r.integer("numa_node", -1, -1, kMaxIndex));
  gpu.cpuset = r.string("cpuset", "");
  gpu.pcie_gbytes_per_s = r.number("pcie_gbytes_per_s", 0, 0);
  gpu.nvlink = parse_list<NvlinkPeer>(r, "nvlink", parse_nvlink);
  gpu.nvlink_domain = r.string("nvlink_domain", "");
  return gpu;
}

Nic parse_nic(const json& j, const std::string& path) {
  JsonReader r(j, path);
  r.allow_only({"name", "interfaces", "kind", "bus_id", "numa_node", "gbytes_per_s"});
  Nic nic;
  nic.name = r.required_string("name");
  nic.interfaces = parse_strings(r, "interfaces");
  nic.kind = r.choice("kind", "network", {"infiniband", "ethernet", "network"});
  nic.bus_id = r.string("bus_id", "");
  nic.numa_node = static_cast<int>(r.integer("numa_node", -1, -1, kMaxIndex));
  nic.gbytes_per_s = r.number("gbytes_per_s", 0, 0);
  return nic;
}

// The host record's string syntaxes, compiled once under one static guard: compiling std::regex
// writes libstdc++'s shared ctype cache, so two compiles must never run at once (ranks as threads
// parse their records concurrently; ThreadSanitizer reported it).
struct RecordPatterns {
  // hwloc_bitmap_sscanf syntax: comma-separated 32-bit hex words, the first with "0x" (or "0xf...f"
  // for an infinite set); an empty word is zero, but a later "0x" needs its digits too.
  std::regex cpuset{"(0xf\\.\\.\\.f|0x[0-9a-fA-F]{1,8})(,((0x)?[0-9a-fA-F]{1,8})?)*"};
  // dddd:bb:dd.f, lower case as CUDA and hwloc print it (the domain may be wider than 4 digits).
  std::regex bus_id{"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]"};
  std::regex cpu_package{"package:[0-9]+"};
};

const RecordPatterns& record_patterns() {
  static const RecordPatterns patterns;
  return patterns;
}

bool is_cpuset(const std::string& s) { return s.empty() || std::regex_match(s, record_patterns().cpuset); }
bool is_bus_id(const std::string& s) { return std::regex_match(s, record_patterns().bus_id); }

// What parsing each record alone cannot see: repeats, malformed strings, domains without links.
void check_host(const HostTopology& host, const std::string& path) {
  const auto at = [&](const std::string& list, size_t i, const std::string& key) {
    return path + "/" + list + "/" + std::to_string(i) + (key.empty() ? "" : "/" + key);
  };
  const auto fail = [](const std::string& where, const std::string& message) {
    throw std::invalid_argument(where + ": " + message);
  };
  const auto check_cpuset = [&](const std::string& where, const std::string& value) {
    if (!is_cpuset(value)) fail(where, "'" + value + "' is not an hwloc cpuset: write hex words like \"0xff,0xffffffff\"");
  };
  const auto check_bus_id = [&](const std::string& where, const std::string& value) {
    if (!value.empty() && !is_bus_id(value)) {
      fail(where, "'" + value + "' is not a PCI bus id: write dddd:bb:dd.f in lower case, e.g. \"0000:1b:00.0\"");
    }
  };
  std::map<int, size_t> numa_seen;
  for (size_t i = 0; i < host.numa_nodes.size(); ++i) {
    const NumaNode& numa = host.numa_nodes[i];
    const auto first = numa_seen.emplace(numa.os_index, i);
    if (!first.second) {
      fail(at("numa_nodes", i, "os_index"), "NUMA node " + std::to_string(numa.os_index) + " is listed twice (first at " +
                                                at("numa_nodes", first.first->second, "") + "): list each node once");
    }
    check_cpuset(at("numa_nodes", i, "cpuset"), numa.cpuset);
  }
  // A GPU or NIC placed on a node the host does not list would be planned against no node at all.
  const auto check_numa = [&](const std::string& where, int node) {
    if (node < 0 || numa_seen.empty() || numa_seen.count(node) > 0) return;
    std::string listed;
    for (const auto& entry : numa_seen) listed += (listed.empty() ? "" : ", ") + std::to_string(entry.first);
    fail(where, "NUMA node " + std::to_string(node) + " is not among the host's numa_nodes (" + listed +
                    "): name one of them, or -1 when unknown");
  };
  for (size_t i = 0; i < host.packages.size(); ++i) check_cpuset(at("packages", i, "cpuset"), host.packages[i].cpuset);
  std::map<int, size_t> index_seen;
  std::map<std::string, std::string> domain_of_bus;
  for (const Gpu& gpu : host.gpus)
    if (!gpu.bus_id.empty()) domain_of_bus[gpu.bus_id] = gpu.nvlink_domain;
  for (size_t i = 0; i < host.gpus.size(); ++i) {
    const Gpu& gpu = host.gpus[i];
    const auto first = index_seen.emplace(gpu.index, i);
    if (!first.second) {
      fail(at("gpus", i, "index"), "GPU index " + std::to_string(gpu.index) + " is listed twice (first at " +
                                       at("gpus", first.first->second, "") + "): GPU indices are unique per host");
    }
    check_bus_id(at("gpus", i, "bus_id"), gpu.bus_id);
    check_cpuset(at("gpus", i, "cpuset"), gpu.cpuset);
    check_numa(at("gpus", i, "numa_node"), gpu.numa_node);
    std::map<std::pair<std::string, std::string>, size_t> peers;
    bool linked_in_domain = false;
    for (size_t k = 0; k < gpu.nvlink.size(); ++k) {
      const NvlinkPeer& link = gpu.nvlink[k];
      const std::string where = at("gpus", i, "nvlink/" + std::to_string(k));
      const auto repeat = peers.emplace(std::make_pair(link.peer_kind, link.peer), k);
      if (!repeat.second) {
        fail(where, link.peer_kind + " '" + link.peer + "' is listed twice (first at nvlink/" +
                        std::to_string(repeat.first->second) +
                        "), which would double its bandwidth: list each peer once with all its links' bandwidth");
      }
      if (link.peer_kind == "gpu" && !is_bus_id(link.peer)) {
        fail(where + "/peer", "'" + link.peer + "' is not a GPU bus id: write dddd:bb:dd.f in lower case");
      }
      if (link.peer_kind == "cpu" && !std::regex_match(link.peer, record_patterns().cpu_package)) {
        fail(where + "/peer", "'" + link.peer + "' is not a CPU package: write \"package:<os_index>\"");
      }
      const auto peer = domain_of_bus.find(link.peer);
      linked_in_domain |= link.peer_kind == "nvswitch" ||
                          (link.peer_kind == "gpu" && peer != domain_of_bus.end() && peer->second == gpu.nvlink_domain);
    }
    // The planner takes a domain for NVLink bandwidth among its GPUs: a member needs a link into it.
    if (!gpu.nvlink_domain.empty() && !linked_in_domain) {
      fail(at("gpus", i, "nvlink_domain"), "GPU " + std::to_string(gpu.index) + " is in NVLink domain '" +
                                               gpu.nvlink_domain + "' but has no NVLink to an NVSwitch or to a GPU of "
                                               "that domain: add its nvlink entries or drop nvlink_domain");
    }
  }
  std::map<std::string, size_t> nic_seen;
  for (size_t i = 0; i < host.nics.size(); ++i) {
    const auto first = nic_seen.emplace(host.nics[i].name, i);
    if (!first.second) {
      fail(at("nics", i, "name"), "NIC '" + host.nics[i].name + "' is listed twice (first at " +
                                      at("nics", first.first->second, "") + "): list each NIC once");
    }
    check_bus_id(at("nics", i, "bus_id"), host.nics[i].bus_id);
    check_numa(at("nics", i, "numa_node"), host.nics[i].numa_node);
  }
}

}  // namespace

HostTopology parse_host(const json& j, const std::string& json_path) {
  JsonReader r(j, json_path);
  r.allow_only({"hostname", "source", "packages", "numa_nodes", "gpus", "nics", "notes"});
  HostTopology host;
  host.hostname = r.required_string("hostname");
  host.source = r.string("source", "");
  host.packages = parse_list<Package>(r, "packages", parse_package);
  host.numa_nodes = parse_list<NumaNode>(r, "numa_nodes", parse_numa);
  host.gpus = parse_list<Gpu>(r, "gpus", parse_gpu);
  host.nics = parse_list<Nic>(r, "nics", parse_nic);
  host.notes = parse_strings(r, "notes");
  check_host(host, json_path);
  return host;
}

void from_json(const json& j, NvlinkPeer& v) { v = parse_nvlink(j, ""); }
void from_json(const json& j, Package& v) { v = parse_package(j, ""); }
void from_json(const json& j, NumaNode& v) { v = parse_numa(j, ""); }
void from_json(const json& j, Gpu& v) { v = parse_gpu(j, ""); }
void from_json(const json& j, Nic& v) { v = parse_nic(j, ""); }
void from_json(const json& j, HostTopology& v) { v = parse_host(j, ""); }
void from_json(const json& j, Cluster& v) {
  JsonReader r(j, "");
  r.allow_only({"hosts"});
  v = Cluster(parse_list<HostTopology>(r, "hosts", parse_host));
}

Cluster::Cluster(std::vector<HostTopology> hosts) : hosts_(std::move(hosts)) {
  std::set<std::string> hostnames;
  std::map<std::string, int> domain_ids;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const HostTopology& host = hosts_[h];
    if (host.hostname.empty()) {
      throw std::invalid_argument("host " + std::to_string(h) + " has no hostname: give every host a unique name");
    }
    if (!hostnames.insert(host.hostname).second) {
      throw std::invalid_argument("hostname '" + host.hostname + "' appears twice: host names must be unique");
    }
    std::set<int> indices;
    for (size_t g = 0; g < host.gpus.size(); ++g) {
      const Gpu& gpu = host.gpus[g];
      if (!indices.insert(gpu.index).second) {
        throw std::invalid_argument("host '" + host.hostname + "' lists GPU index " + std::to_string(gpu.index) +
                                    " twice: GPU indices must be unique per host");
      }
      slot_host_.push_back(static_cast<int>(h));
      slot_gpu_.push_back(static_cast<int>(g));
      if (gpu.nvlink_domain.empty()) {
        slot_domain_.push_back(domain_count_++);
      } else {
        auto it = domain_ids.emplace(gpu.nvlink_domain, domain_count_);
        if (it.second) ++domain_count_;
        slot_domain_.push_back(it.first->second);
      }
    }
  }
}

Cluster make_cluster(const ClusterTemplate& shape) {
  if (shape.host_count < 1 || shape.hosts_per_nvlink_domain < 1) {
    throw std::invalid_argument("host_count=" + std::to_string(shape.host_count) + " and hosts_per_nvlink_domain=" +
                                std::to_string(shape.hosts_per_nvlink_domain) + " must both be >= 1");
  }
  const int digits = static_cast<int>(std::to_string(shape.host_count - 1).size());
  std::vector<HostTopology> hosts(shape.host_count, shape.host);
  for (int h = 0; h < shape.host_count; ++h) {
    HostTopology& host = hosts[h];
    std::string index = std::to_string(h);
    host.hostname = shape.hostname_prefix + std::string(digits - index.size(), '0') + index;
    for (Gpu& gpu : host.gpus) {
      if (gpu.nvlink_domain.empty()) continue;
      gpu.nvlink_domain = shape.hosts_per_nvlink_domain == 1
                              ? host.hostname + "/" + gpu.nvlink_domain
                              : "nvl" + std::to_string(h / shape.hosts_per_nvlink_domain) + "/" + gpu.nvlink_domain;
    }
  }
  return Cluster(std::move(hosts));
}

Cluster Cluster::from_records(const std::vector<std::string>& json_records) {
  std::vector<HostTopology> hosts;
  std::map<std::string, json> seen;  // hostname -> canonical record
  for (size_t i = 0; i < json_records.size(); ++i) {
    const std::string path = "/records/" + std::to_string(i);
    // A peer's bytes: bounded and checked like a profile's before nlohmann's recursion sees them.
    const json record = internal::parse_json_text(json_records[i], path);
    HostTopology host = parse_host(record, path);
    const json canonical = host;
    auto it = seen.find(host.hostname);
    if (it != seen.end()) {
      if (it->second != canonical) {
        throw std::invalid_argument(path + ": host '" + host.hostname +
                                    "' sent a record that differs from an earlier one: every rank on a host must "
                                    "report the same topology (check that discovery ran with the same inputs)");
      }
      continue;
    }
    seen.emplace(host.hostname, canonical);
    hosts.push_back(std::move(host));
  }
  return Cluster(std::move(hosts));
}

std::string format_host(const HostTopology& host) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "host %s (source: %s)\n", host.hostname.c_str(), host.source.c_str());
  out += line;
  std::snprintf(line, sizeof line, "  packages: %zu   NUMA nodes: %zu   GPUs: %zu   NICs: %zu\n", host.packages.size(),
                host.numa_nodes.size(), host.gpus.size(), host.nics.size());
  out += line;
  out += "\n  NUMA  memory(GiB)  cpuset\n";
  for (const NumaNode& node : host.numa_nodes) {
    std::snprintf(line, sizeof line, "  %4d  %11.1f  %s\n", node.os_index, node.memory_bytes / double(1ull << 30),
                  node.cpuset.c_str());
    out += line;
  }
  if (!host.gpus.empty()) {
    out += "\n  GPU  bus id        NUMA  PCIe GB/s  NVLink domain         NVLink peers (GB/s)            model\n";
    for (const Gpu& gpu : host.gpus) {
      std::string peers;
      for (const NvlinkPeer& link : gpu.nvlink) {
        char peer[96];
        std::snprintf(peer, sizeof peer, "%s%s %s=%g", peers.empty() ? "" : ", ", link.peer_kind.c_str(),
                      link.peer.c_str(), link.gbytes_per_s);
        peers += peer;
      }
      std::snprintf(line, sizeof line, "  %3d  %-12s  %4d  %9.2f  %-20s  %-29s  %s\n", gpu.index, gpu.bus_id.c_str(),
                    gpu.numa_node, gpu.pcie_gbytes_per_s, gpu.nvlink_domain.empty() ? "-" : gpu.nvlink_domain.c_str(),
                    peers.empty() ? "-" : peers.c_str(), gpu.model.c_str());
      out += line;
    }
  }
  if (!host.nics.empty()) {
    out += "\n  NIC         kind        bus id        NUMA  GB/s   interfaces\n";
    for (const Nic& nic : host.nics) {
      std::string interfaces;
      for (const std::string& name : nic.interfaces) interfaces += (interfaces.empty() ? "" : ",") + name;
      std::snprintf(line, sizeof line, "  %-10s  %-10s  %-12s  %4d  %5.1f  %s\n", nic.name.c_str(), nic.kind.c_str(),
                    nic.bus_id.c_str(), nic.numa_node, nic.gbytes_per_s, interfaces.c_str());
      out += line;
    }
  }
  for (const std::string& note : host.notes) out += "  note: " + note + "\n";
  return out;
}

}  // namespace gtp::topology

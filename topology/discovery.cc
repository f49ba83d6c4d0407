#include "topology/discovery.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <stdexcept>

#include "topology/internal/child_probe.h"
#include "topology/internal/gpu_driver.h"
#include "topology/internal/json_text.h"

namespace gtp::topology {
namespace {

// An hwloc export of a large machine loads in milliseconds; a minute means hwloc is stuck.
constexpr std::chrono::milliseconds kHwlocTrialTimeout{60000};
constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kPciClassVga = 0x0300, kPciClass3d = 0x0302;
constexpr unsigned kPciClassEthernet = 0x0200, kPciClassInfiniband = 0x0207;

class HwlocTopology {
 public:
  HwlocTopology() {
    if (hwloc_topology_init(&topology_) != 0) throw std::runtime_error("hwloc_topology_init failed");
    // I/O objects are filtered out by default; GPUs and NICs live there.
    hwloc_topology_set_io_types_filter(topology_, HWLOC_TYPE_FILTER_KEEP_ALL);
  }
  ~HwlocTopology() { hwloc_topology_destroy(topology_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_ = nullptr;
};

std::string bitmap_string(hwloc_const_bitmap_t bitmap) {
  if (!bitmap) return "";
  char* text = nullptr;
  if (hwloc_bitmap_asprintf(&text, bitmap) < 0 || !text) return "";
  std::string out(text);
  std::free(text);
  return out;
}

std::string pci_bus_id(hwloc_obj_t pci) {
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return out;
}

const char* info(hwloc_obj_t obj, const char* name) {
  const char* value = hwloc_obj_get_info_by_name(obj, name);
  return value ? value : "";
}

// NUMA node os_index closest to an I/O object, -1 when its locality spans several nodes.
int numa_of(hwloc_topology_t topology, hwloc_obj_t io) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, io);
  if (!ancestor || !ancestor->nodeset || hwloc_bitmap_weight(ancestor->nodeset) != 1) return -1;
  return hwloc_bitmap_first(ancestor->nodeset);
}

std::string cpuset_of(hwloc_topology_t topology, hwloc_obj_t io) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, io);
  return ancestor ? bitmap_string(ancestor->cpuset) : "";
}

bool is_gpu(hwloc_obj_t pci) {
  return pci->attr->pcidev.vendor_id == kNvidiaVendor &&
         (pci->attr->pcidev.class_id == kPciClassVga || pci->attr->pcidev.class_id == kPciClass3d);
}

std::vector<hwloc_obj_t> os_devices(hwloc_obj_t pci) {
  std::vector<hwloc_obj_t> out;
  for (hwloc_obj_t child = pci->io_first_child; child; child = child->next_sibling)
    if (child->type == HWLOC_OBJ_OS_DEVICE) out.push_back(child);
  return out;
}

Gpu read_gpu(hwloc_topology_t topology, hwloc_obj_t pci) {
  Gpu gpu;
  gpu.bus_id = pci_bus_id(pci);
  gpu.numa_node = numa_of(topology, pci);
  gpu.cpuset = cpuset_of(topology, pci);
  gpu.pcie_gbytes_per_s = pci->attr->pcidev.linkspeed;
  gpu.model = info(pci, "PCIDevice");
  for (hwloc_obj_t osdev : os_devices(pci)) {
    if (*info(osdev, "GPUModel")) gpu.model = info(osdev, "GPUModel");
    if (*info(osdev, "NVIDIAUUID")) gpu.uuid = info(osdev, "NVIDIAUUID");
  }
  return gpu;
}

Nic read_nic(hwloc_topology_t topology, hwloc_obj_t pci) {
  Nic nic;
  nic.bus_id = pci_bus_id(pci);
  nic.numa_node = numa_of(topology, pci);
  const unsigned cls = pci->attr->pcidev.class_id;
  nic.kind = cls == kPciClassInfiniband ? "infiniband" : cls == kPciClassEthernet ? "ethernet" : "network";
  for (hwloc_obj_t osdev : os_devices(pci)) {
    if (osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) nic.name = osdev->name;
    if (osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) nic.interfaces.push_back(osdev->name);
  }
  if (nic.name.empty()) nic.name = nic.interfaces.empty() ? nic.bus_id : nic.interfaces.front();
  return nic;
}

// The GPU or peer an NVLinkBandwidth matrix entry stands for: GPUs appear as their NVML OS
// device, NVSwitches as PCI devices, CPUs (POWER NVLink) as packages.
NvlinkPeer matrix_peer(hwloc_obj_t obj) {
  if (obj->type == HWLOC_OBJ_OS_DEVICE && obj->parent && obj->parent->type == HWLOC_OBJ_PCI_DEVICE) {
    return NvlinkPeer{"gpu", pci_bus_id(obj->parent), 0};
  }
  if (obj->type == HWLOC_OBJ_PCI_DEVICE) return NvlinkPeer{is_gpu(obj) ? "gpu" : "nvswitch", pci_bus_id(obj), 0};
  if (obj->type == HWLOC_OBJ_PACKAGE) return NvlinkPeer{"cpu", "package:" + std::to_string(obj->os_index), 0};
  return NvlinkPeer{"", "", 0};
}

// hwloc's NVLinkBandwidth values are unidirectional MB/s; the diagonal is artificially high.
void read_nvlink_matrix(hwloc_topology_t topology, HostTopology* host) {
  unsigned count = 0;
  if (hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &count, nullptr, 0) != 0 || count == 0) return;
  std::vector<hwloc_distances_s*> matrices(count);
  hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &count, matrices.data(), 0);
  for (unsigned m = 0; m < count; ++m) {
    const hwloc_distances_s* matrix = matrices[m];
    for (unsigned i = 0; i < matrix->nbobjs; ++i) {
      const NvlinkPeer self = matrix_peer(matrix->objs[i]);
      auto gpu = std::find_if(host->gpus.begin(), host->gpus.end(),
                              [&](const Gpu& g) { return self.peer_kind == "gpu" && g.bus_id == self.peer; });
      if (gpu == host->gpus.end()) continue;
      for (unsigned j = 0; j < matrix->nbobjs; ++j) {
        const uint64_t mbytes_per_s = matrix->values[i * matrix->nbobjs + j];
        if (i == j || mbytes_per_s == 0) continue;
        NvlinkPeer peer = matrix_peer(matrix->objs[j]);
        if (peer.peer_kind.empty()) continue;
        peer.gbytes_per_s = mbytes_per_s / 1000.0;
        gpu->nvlink.push_back(peer);
      }
    }
    hwloc_distances_release(topology, matrices[m]);
  }
  host->notes.push_back("NVLink from hwloc's NVLinkBandwidth distances matrix");
}

// Directly linked GPUs form a domain "<host>/nvlink<lowest index>"; GPUs wired to NVSwitches share
// "<host>/nvswitch" unless NVML already gave them a fabric (multi-node) domain.
void assign_nvlink_domains(HostTopology* host) {
  const size_t n = host->gpus.size();
  std::vector<size_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto root = [&](size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::map<std::string, size_t> by_bus;
  for (size_t i = 0; i < n; ++i) by_bus[host->gpus[i].bus_id] = i;
  std::vector<bool> linked(n, false), switched(n, false);
  for (size_t i = 0; i < n; ++i) {
    for (const NvlinkPeer& link : host->gpus[i].nvlink) {
      if (link.peer_kind == "nvswitch") switched[i] = linked[i] = true;
      auto peer = by_bus.find(link.peer);
      if (link.peer_kind == "gpu" && peer != by_bus.end()) {
        linked[i] = linked[peer->second] = true;
        parent[root(i)] = root(peer->second);
      }
    }
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (switched[i] && switched[j]) parent[root(i)] = root(j);
  std::map<size_t, int> lowest;  // component root -> lowest GPU index
  for (size_t i = 0; i < n; ++i) {
    auto it = lowest.emplace(root(i), host->gpus[i].index).first;
    it->second = std::min(it->second, host->gpus[i].index);
  }
  for (size_t i = 0; i < n; ++i) {
    Gpu& gpu = host->gpus[i];
    if (!gpu.nvlink_domain.empty() || !linked[i]) continue;
    gpu.nvlink_domain = switched[i] ? host->hostname + "/nvswitch"
                                    : host->hostname + "/nvlink" + std::to_string(lowest[root(i)]);
  }
}

// nvlink_from_matrix: XML exports carry hwloc's NVML matrix; the live machine asks NVML directly.
HostTopology read_host(hwloc_topology_t topology, bool nvlink_from_matrix) {
  HostTopology host;
  host.hostname = info(hwloc_get_root_obj(topology), "HostName");
  for (hwloc_obj_t obj = nullptr; (obj = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_PACKAGE, obj));) {
    host.packages.push_back(Package{static_cast<int>(obj->os_index), bitmap_string(obj->cpuset)});
  }
  for (hwloc_obj_t obj = nullptr; (obj = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, obj));) {
    host.numa_nodes.push_back(
        NumaNode{static_cast<int>(obj->os_index), bitmap_string(obj->cpuset), obj->attr->numanode.local_memory});
  }
  for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(topology, pci));) {
    const unsigned cls = pci->attr->pcidev.class_id;
    if (is_gpu(pci)) host.gpus.push_back(read_gpu(topology, pci));
    else if ((cls >> 8) == 0x02) host.nics.push_back(read_nic(topology, pci));
  }
  std::sort(host.gpus.begin(), host.gpus.end(), [](const Gpu& a, const Gpu& b) { return a.bus_id < b.bus_id; });
  for (size_t i = 0; i < host.gpus.size(); ++i) host.gpus[i].index = static_cast<int>(i);
  if (nvlink_from_matrix) read_nvlink_matrix(topology, &host);
  return host;
}

// Link rate from sysfs: InfiniBand ports say "400 Gb/sec (4X NDR)", netdevs give Mb/s.
double sysfs_nic_gbytes_per_s(const Nic& nic) {
  std::ifstream rate("/sys/class/infiniband/" + nic.name + "/ports/1/rate");
  double value = 0;
  if (rate >> value && value > 0) return value / 8.0;
  for (const std::string& interface : nic.interfaces) {
    std::ifstream speed("/sys/class/net/" + interface + "/speed");
    if (speed >> value && value > 0) return value / 8000.0;
  }
  return 0;
}

// Matches hwloc's PCI GPUs with the CUDA ordinals, then adds NVML's NVLink and fabric data.
void add_driver_data(HostTopology* host) {
  std::vector<std::string> cuda_ids;
  std::string why;
  if (internal::cuda_device_bus_ids(&cuda_ids, &why)) {
    std::vector<Gpu> ordered;
    for (size_t ordinal = 0; ordinal < cuda_ids.size(); ++ordinal) {
      auto it = std::find_if(host->gpus.begin(), host->gpus.end(),
                             [&](const Gpu& g) { return g.bus_id == cuda_ids[ordinal]; });
      Gpu gpu = it != host->gpus.end() ? *it : Gpu{};
      if (it == host->gpus.end()) {
        gpu.bus_id = cuda_ids[ordinal];
        host->notes.push_back("CUDA device " + std::to_string(ordinal) + " (" + gpu.bus_id +
                              ") is not in hwloc's PCI tree: no NUMA locality for it");
      }
      gpu.index = static_cast<int>(ordinal);
      ordered.push_back(gpu);
    }
    host->gpus = ordered;
  } else {
    host->notes.push_back(why + "; GPUs listed from the PCI tree in bus order");
  }
  if (host->gpus.empty()) return;
  std::vector<std::string> bus_ids;
  for (const Gpu& gpu : host->gpus) bus_ids.push_back(gpu.bus_id);
  std::vector<internal::NvmlGpu> nvml;
  if (!internal::nvml_query(bus_ids, &nvml, &why)) {
    host->notes.push_back(why);
    return;
  }
  for (size_t i = 0; i < host->gpus.size(); ++i) {
    Gpu& gpu = host->gpus[i];
    if (!nvml[i].model.empty()) gpu.model = nvml[i].model;
    if (!nvml[i].uuid.empty()) gpu.uuid = nvml[i].uuid;
    gpu.nvlink = nvml[i].nvlink;
    gpu.nvlink_domain = nvml[i].fabric_domain;
  }
  host->notes.push_back("NVLink from NVML");
}

// The machine's hardware does not change while a process runs, and a live load scans PCI and dlopens
// hwloc plugins (whose libpciaccess state would be reported as leaked once they are unloaded), so
// the process keeps one loaded topology for its whole life.
hwloc_topology_t live_topology() {
  static HwlocTopology* const topology = [] {
    auto* loaded = new HwlocTopology();
    if (hwloc_topology_load(loaded->get()) != 0) {
      delete loaded;
      throw std::runtime_error("hwloc could not load this machine's topology");
    }
    return loaded;
  }();
  return topology->get();
}

}  // namespace

HostTopology load_hwloc_xml(const std::string& path) {
  return load_hwloc_xml_text(internal::read_regular_file(path, "hwloc XML file"), path);
}

HostTopology load_hwloc_xml_text(const std::string& xml, const std::string& name) {
  if (static_cast<std::int64_t>(xml.size()) > internal::kMaxJsonBytes) {
    throw std::invalid_argument("hwloc XML '" + name + "' is " + std::to_string(xml.size()) +
                                " bytes, over the 64 MiB limit: is it the right file?");
  }
  const size_t nul = xml.find('\0');
  if (nul != std::string::npos) {
    throw std::invalid_argument("hwloc XML '" + name + "' has a NUL byte at offset " + std::to_string(nul) +
                                ": hwloc would ignore what follows it; re-export it with lstopo --of xml");
  }
  const std::string invalid = "'" + name + "' is not a valid hwloc XML topology: re-export it with lstopo --of xml";
  // hwloc 2.9 crashes on some malformed XML (a PU without complete_cpuset segfaults in
  // hwloc_bitmap_compare_first), so a forked child loads and reads these bytes first; this process
  // loads them only after the child did so completely. hwloc's components load here, before the
  // fork, so the child does not dlopen.
  HwlocTopology topology;
  const int size = static_cast<int>(xml.size()) + 1;  // hwloc's buffer length counts the ending NUL
  const internal::ChildOutcome trial = internal::run_in_child(
      [&] {
        if (hwloc_topology_set_xmlbuffer(topology.get(), xml.c_str(), size) != 0 ||
            hwloc_topology_load(topology.get()) != 0) {
          return false;
        }
        HostTopology host = read_host(topology.get(), /*nvlink_from_matrix=*/true);
        assign_nvlink_domains(&host);
        return true;
      },
      kHwlocTrialTimeout);
  if (trial.kind == internal::ChildOutcome::kDied) {
    throw std::invalid_argument("hwloc crashed with " + trial.how + " loading '" + name +
                                "' (tried in a child process, so this one is unharmed): the XML is malformed, "
                                "for example an object without its complete_cpuset; re-export it with lstopo --of xml");
  }
  if (trial.kind == internal::ChildOutcome::kTimedOut) {
    throw std::invalid_argument("hwloc did not finish loading '" + name + "' within " +
                                std::to_string(kHwlocTrialTimeout.count() / 1000) +
                                " s (tried in a child process, which was killed): re-export it with lstopo --of xml");
  }
  if (trial.kind == internal::ChildOutcome::kFalse) throw std::invalid_argument(invalid);
  if (hwloc_topology_set_xmlbuffer(topology.get(), xml.c_str(), size) != 0 || hwloc_topology_load(topology.get()) != 0) {
    throw std::invalid_argument(invalid);
  }
  HostTopology host = read_host(topology.get(), /*nvlink_from_matrix=*/true);
  host.source = "hwloc-xml:" + name;
  if (host.hostname.empty()) host.hostname = name.substr(name.find_last_of('/') + 1);
  assign_nvlink_domains(&host);
  host.notes.push_back("replayed from XML: GPUs numbered in PCI bus order, NIC link rates unknown");
  // Host records travel as JSON, which must be UTF-8: a name in the XML that is not failed later, in
  // gtp-topo --json or a plan, with nlohmann's bare message (found by hwloc_xml_fuzz).
  try {
    (void)nlohmann::json(host).dump();
  } catch (const nlohmann::json::type_error& error) {
    throw std::invalid_argument("hwloc XML '" + name + "' has a name or info value that is not valid UTF-8 (" +
                                error.what() + "): fix that text or re-export it with lstopo --of xml");
  }
  return host;
}

HostTopology discover_local() {
  HostTopology host = read_host(live_topology(), /*nvlink_from_matrix=*/false);
  host.source = "live";
  if (host.hostname.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof name - 1);
    host.hostname = name;
  }
  add_driver_data(&host);
  assign_nvlink_domains(&host);
  for (Nic& nic : host.nics) nic.gbytes_per_s = sysfs_nic_gbytes_per_s(nic);
  if (host.gpus.empty()) host.notes.push_back("no NVIDIA GPU found");
  return host;
}

}  // namespace gtp::topology

#include "topology/internal/gpu_driver.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>

namespace gtp::topology::internal {
namespace {

// The few driver entry points we call, declared here because no driver header is installed.
using CuResult = int;
using CuInit = CuResult (*)(unsigned);
using CuDeviceGetCount = CuResult (*)(int*);
using CuDeviceGet = CuResult (*)(int*, int);
using CuDeviceGetPciBusId = CuResult (*)(char*, int, int);

using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;               // NVML_NVLINK_MAX_LINKS
constexpr unsigned kNvmlLinkPeerGpu = 0x00;          // NVML_NVLINK_DEVICE_TYPE_GPU
constexpr unsigned kNvmlLinkPeerIbmNpu = 0x01;       // NVML_NVLINK_DEVICE_TYPE_IBMNPU (CPU)
constexpr unsigned kNvmlLinkPeerSwitch = 0x02;       // NVML_NVLINK_DEVICE_TYPE_SWITCH
constexpr unsigned char kNvmlFabricCompleted = 3;    // NVML_GPU_FABRIC_STATE_COMPLETED

struct NvmlPciInfo {  // nvmlPciInfo_t
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct NvmlFabricInfo {  // nvmlGpuFabricInfo_t
  unsigned char cluster_uuid[16];
  NvmlReturn status;
  unsigned clique_id;
  unsigned char state;
};

class Library {
 public:
  explicit Library(const char* name) : handle_(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle_) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  bool loaded() const { return handle_ != nullptr; }
  template <typename Fn>
  Fn symbol(const char* name) const {
    return handle_ ? reinterpret_cast<Fn>(dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_;
};

std::string hex_bytes(const unsigned char* bytes, size_t count) {
  std::string out;
  char digit[3];
  for (size_t i = 0; i < count; ++i) {
    std::snprintf(digit, sizeof digit, "%02x", bytes[i]);
    out += digit;
  }
  return out;
}

}  // namespace

std::string normalize_bus_id(const std::string& bus_id) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  char tail = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) != 4) {
    domain = 0;
    if (std::sscanf(bus_id.c_str(), "%x:%x.%x%c", &bus, &device, &function, &tail) != 3) return "";
  }
  if (bus > 0xff || device > 0x1f || function > 7 || domain > 0xffff) return "";
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

bool cuda_device_bus_ids(std::vector<std::string>* bus_ids, std::string* why) {
  Library cuda("libcuda.so.1");
  if (!cuda.loaded()) {
    *why = "CUDA driver libcuda.so.1 not loadable (no NVIDIA driver?)";
    return false;
  }
  auto init = cuda.symbol<CuInit>("cuInit");
  auto count = cuda.symbol<CuDeviceGetCount>("cuDeviceGetCount");
  auto get = cuda.symbol<CuDeviceGet>("cuDeviceGet");
  auto bus = cuda.symbol<CuDeviceGetPciBusId>("cuDeviceGetPCIBusId");
  if (!init || !count || !get || !bus) {
    *why = "libcuda.so.1 lacks cuInit/cuDeviceGetCount/cuDeviceGet/cuDeviceGetPCIBusId";
    return false;
  }
  int devices = 0;
  if (int rc = init(0); rc != 0) {
    *why = "cuInit failed with CUresult " + std::to_string(rc) + " (no usable GPU?)";
    return false;
  }
  if (count(&devices) != 0 || devices == 0) {
    *why = "the CUDA driver reports no device";
    return false;
  }
  for (int ordinal = 0; ordinal < devices; ++ordinal) {
    int device = 0;
    char id[64] = {0};
    if (get(&device, ordinal) != 0 || bus(id, sizeof id, device) != 0) {
      *why = "cuDeviceGetPCIBusId failed for CUDA device " + std::to_string(ordinal);
      return false;
    }
    bus_ids->push_back(normalize_bus_id(id));
  }
  return true;
}

double nvlink_gbytes_per_s_per_link(unsigned nvml_version) {
  if (nvml_version == 1) return 20;                         // NVLink 1.0 (P100)
  if (nvml_version >= 2 && nvml_version <= 6) return 25;    // NVLink 2.0, 2.2, 3.0, 3.1, 4.0
  if (nvml_version == 7) return 50;                         // NVLink 5.0 (Blackwell)
  return 0;
}

bool nvml_query(const std::vector<std::string>& bus_ids, std::vector<NvmlGpu>* gpus, std::string* why) {
  gpus->assign(bus_ids.size(), NvmlGpu{});
  Library nvml("libnvidia-ml.so.1");
  if (!nvml.loaded()) {
    *why = "NVML (libnvidia-ml.so.1) not loadable: no NVLink, NVSwitch or fabric data";
    return false;
  }
  auto init = nvml.symbol<NvmlReturn (*)()>("nvmlInit_v2");
  auto shutdown = nvml.symbol<NvmlReturn (*)()>("nvmlShutdown");
  auto by_bus = nvml.symbol<NvmlReturn (*)(const char*, NvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
  auto name = nvml.symbol<NvmlReturn (*)(NvmlDevice, char*, unsigned)>("nvmlDeviceGetName");
  auto uuid = nvml.symbol<NvmlReturn (*)(NvmlDevice, char*, unsigned)>("nvmlDeviceGetUUID");
  auto state = nvml.symbol<NvmlReturn (*)(NvmlDevice, unsigned, unsigned*)>("nvmlDeviceGetNvLinkState");
  auto version = nvml.symbol<NvmlReturn (*)(NvmlDevice, unsigned, unsigned*)>("nvmlDeviceGetNvLinkVersion");
  auto remote = nvml.symbol<NvmlReturn (*)(NvmlDevice, unsigned, NvmlPciInfo*)>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  auto remote_type =
      nvml.symbol<NvmlReturn (*)(NvmlDevice, unsigned, unsigned*)>("nvmlDeviceGetNvLinkRemoteDeviceType");
  auto fabric = nvml.symbol<NvmlReturn (*)(NvmlDevice, NvmlFabricInfo*)>("nvmlDeviceGetGpuFabricInfo");
  if (!init || !shutdown || !by_bus || !state || !remote) {
    *why = "libnvidia-ml.so.1 lacks the NVLink entry points (driver too old)";
    return false;
  }
  if (int rc = init(); rc != kNvmlSuccess) {
    *why = "nvmlInit_v2 failed with nvmlReturn_t " + std::to_string(rc);
    return false;
  }
  for (size_t i = 0; i < bus_ids.size(); ++i) {
    NvmlDevice device = nullptr;
    if (by_bus(bus_ids[i].c_str(), &device) != kNvmlSuccess) continue;
    NvmlGpu& gpu = (*gpus)[i];
    char text[96] = {0};
    if (name && name(device, text, sizeof text) == kNvmlSuccess) gpu.model = text;
    if (uuid && uuid(device, text, sizeof text) == kNvmlSuccess) gpu.uuid = text;
    std::map<std::pair<std::string, std::string>, double> merged;  // (kind, peer) -> GB/s
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      unsigned active = 0, link_version = 0, peer_type = kNvmlLinkPeerGpu;
      NvmlPciInfo pci{};
      if (state(device, link, &active) != kNvmlSuccess || !active) continue;
      if (remote(device, link, &pci) != kNvmlSuccess) continue;
      if (version) version(device, link, &link_version);
      if (remote_type) remote_type(device, link, &peer_type);
      const std::string kind = peer_type == kNvmlLinkPeerSwitch   ? "nvswitch"
                               : peer_type == kNvmlLinkPeerIbmNpu ? "cpu"
                                                                  : "gpu";
      merged[{kind, normalize_bus_id(pci.bus_id)}] += nvlink_gbytes_per_s_per_link(link_version);
    }
    for (const auto& entry : merged) gpu.nvlink.push_back(NvlinkPeer{entry.first.first, entry.first.second, entry.second});
    NvmlFabricInfo info{};
    if (fabric && fabric(device, &info) == kNvmlSuccess && info.state == kNvmlFabricCompleted &&
        info.status == kNvmlSuccess) {
      static const unsigned char kZero[16] = {0};
      if (std::memcmp(info.cluster_uuid, kZero, sizeof kZero) != 0) {
        gpu.fabric_domain = "fabric:" + hex_bytes(info.cluster_uuid, 16) + "/" + std::to_string(info.clique_id);
      }
    }
  }
  shutdown();
  return true;
}

}  // namespace gtp::topology::internal

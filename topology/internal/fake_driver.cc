// A stand-in for libcuda.so.1 and libnvidia-ml.so.1, loaded by the driver-path test through
// LD_LIBRARY_PATH so the dlopen code runs without a GPU. It models a 2-GPU host whose GPUs each
// have 18 active NVLink 4.0 links to 4 NVSwitches (5+5+4+4 links) and a completed fabric
// registration (cluster UUID 00 01 .. 0f, clique 7). Layouts follow the public nvml.h/cuda.h.
#include <cstdio>
#include <cstring>

namespace {

const char* const kBusIds[2] = {"0000:1B:00.0", "0000:43:00.0"};  // upper case, as CUDA prints them
const char* const kSwitchBusIds[4] = {"00000000:C4:00.0", "00000000:C5:00.0", "00000000:C6:00.0", "00000000:C7:00.0"};

struct PciInfo {  // nvmlPciInfo_t
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct FabricInfo {  // nvmlGpuFabricInfo_t
  unsigned char cluster_uuid[16];
  int status;
  unsigned clique_id;
  unsigned char state;
};

int device_of(const void* handle) { return static_cast<int>(reinterpret_cast<long>(handle)) - 1; }
int switch_of_link(unsigned link) { return link < 5 ? 0 : link < 10 ? 1 : link < 14 ? 2 : 3; }

}  // namespace

extern "C" {

// libcuda.so.1
int cuInit(unsigned) { return 0; }
int cuDeviceGetCount(int* count) {
  *count = 2;
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return ordinal < 2 ? 0 : 101;  // CUDA_ERROR_INVALID_DEVICE
}
int cuDeviceGetPCIBusId(char* out, int length, int device) {
  std::snprintf(out, length, "%s", kBusIds[device]);
  return 0;
}

// libnvidia-ml.so.1
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  for (int i = 0; i < 2; ++i) {
    if (strcasecmp(bus_id, kBusIds[i]) == 0) {
      *device = reinterpret_cast<void*>(static_cast<long>(i + 1));
      return 0;
    }
  }
  return 6;  // NVML_ERROR_NOT_FOUND
}
int nvmlDeviceGetName(void*, char* name, unsigned length) {
  std::snprintf(name, length, "NVIDIA H100 80GB HBM3");
  return 0;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned length) {
  std::snprintf(uuid, length, "GPU-fake-%d", device_of(device));
  return 0;
}
int nvmlDeviceGetNvLinkState(void*, unsigned link, unsigned* active) {
  *active = link < 18;
  return link < 18 ? 0 : 2;  // NVML_ERROR_INVALID_ARGUMENT
}
int nvmlDeviceGetNvLinkVersion(void*, unsigned, unsigned* version) {
  *version = 6;  // NVML_NVLINK_VERSION_4_0
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void*, unsigned link, PciInfo* pci) {
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->bus_id, sizeof pci->bus_id, "%s", kSwitchBusIds[switch_of_link(link)]);
  return 0;
}
int nvmlDeviceGetNvLinkRemoteDeviceType(void*, unsigned, unsigned* type) {
  *type = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH
  return 0;
}
int nvmlDeviceGetGpuFabricInfo(void*, FabricInfo* info) {
  for (int i = 0; i < 16; ++i) info->cluster_uuid[i] = static_cast<unsigned char>(i);
  info->status = 0;
  info->clique_id = 7;
  info->state = 3;  // NVML_GPU_FABRIC_STATE_COMPLETED
  return 0;
}

}  // extern "C"

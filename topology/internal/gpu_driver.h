// Run-time access to the NVIDIA driver libraries, loaded with dlopen so topology builds and runs on
// machines with no GPU, driver or CUDA toolkit. Every function reports what it could not see.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.h"

namespace gtp::topology::internal {

// "dddd:bb:dd.f" in lower case from any of the spellings CUDA, NVML and hwloc use
// ("00000000:07:00.0", "0000:07:00.0", "0000:07:00.0" upper case); "" if it does not parse.
std::string normalize_bus_id(const std::string& bus_id);

// PCI bus ids of the CUDA devices in CUDA ordinal order (respects CUDA_VISIBLE_DEVICES), from
// libcuda.so.1. Returns false and sets why when the driver is absent or reports no device.
bool cuda_device_bus_ids(std::vector<std::string>* bus_ids, std::string* why);

// Per-link unidirectional NVLink bandwidth (GB/s) for an nvmlNvlinkVersion_t value: NVLink 1.0
// signals 20 GB/s per link per direction, 2.0 to 4.0 25 GB/s, 5.0 50 GB/s. 0 for unknown versions.
double nvlink_gbytes_per_s_per_link(unsigned nvml_version);

struct NvmlGpu {
  std::string model;
  std::string uuid;
  std::vector<NvlinkPeer> nvlink;  // merged per peer
  std::string fabric_domain;       // "fabric:<cluster uuid>/<clique id>" when the fabric is up, else ""
};

// Queries NVML (libnvidia-ml.so.1) for the GPUs with the given bus ids. Returns false and sets why
// when NVML is unavailable; GPUs NVML does not know stay default-constructed.
bool nvml_query(const std::vector<std::string>& bus_ids, std::vector<NvmlGpu>* gpus, std::string* why);

}  // namespace gtp::topology::internal

// Host discovery with hwloc (I/O objects on): packages, NUMA nodes, GPUs, NICs and NVLink.
//
// GPUs are NVIDIA PCI display/3D controllers (vendor 0x10de, class 0x0300 or 0x0302). NVLink comes
// from hwloc's "NVLinkBandwidth" distances when present (XML exported with hwloc's NVML backend),
// and on the live machine from NVML loaded at run time. Nothing here needs a GPU or a driver:
// whatever is missing is recorded in HostTopology::notes.
#pragma once

#include <string>

#include "topology/topology.h"

namespace gtp::topology {

// The machine this process runs on. GPUs are numbered by CUDA ordinal when the CUDA driver is
// present (and limited to the devices CUDA_VISIBLE_DEVICES exposes), else by PCI bus order.
// Throws std::runtime_error if hwloc itself cannot load the machine's topology.
HostTopology discover_local();

// A machine replayed from an hwloc XML export. GPUs are numbered in PCI bus order. Throws
// std::invalid_argument when the file is missing, not a regular file, over 64 MiB or is not hwloc XML.
// hwloc crashes on some malformed XML, so the bytes are first loaded in a forked child: a crash, abort
// or hang (60 s) there is an std::invalid_argument naming the file, and this process loads only XML
// that the child loaded and read completely.
HostTopology load_hwloc_xml(const std::string& path);

// The same from XML text; `name` stands for the file in messages and in HostTopology::source.
HostTopology load_hwloc_xml_text(const std::string& xml, const std::string& name);

}  // namespace gtp::topology

// hwloc XML (gtp-topo probe --xml, a profile's cluster.hwloc_xml): hwloc's own crashes must become
// std::invalid_argument (the child-process trial in topology/discovery.cc); whatever this process
// loads must be read without a crash, and the host record must serialize.
#include <cstdint>
#include <string>

#include "topology/discovery.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string xml(reinterpret_cast<const char*>(data), size);
  try {
    const gtp::topology::HostTopology host = gtp::topology::load_hwloc_xml_text(xml, "fuzz.xml");
    (void)nlohmann::json(host).dump();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

// Profile text (gtp_context_create's profile_json, gtp-topo, gtp-bench --profile): parse, then plan as
// gtp-topo and create do. Every refusal must be std::invalid_argument (INVALID_ARGUMENT at the C ABI);
// any other exception escapes and is a finding, as is a crash or a hang.
#include <cstdint>
#include <string>

#include "topology/planner.h"
#include "topology/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    // Relative hwloc_xml paths resolve against the runfiles root: the seeds name the XML seeds.
    const gtp::topology::Profile profile = gtp::topology::parse_profile_text(text, ".");
    const gtp::topology::Plan plan = gtp::topology::make_plan(profile.cluster, profile.sizes, profile.on_violation);
    (void)gtp::topology::plan_to_json(plan, profile.cluster).dump();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

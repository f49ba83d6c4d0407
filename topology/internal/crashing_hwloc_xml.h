// A two-PU hwloc XML whose first PU lacks complete_cpuset: hwloc 2.9 segfaults loading it (in
// hwloc_bitmap_compare_first). Written for libgtp's tests, which check that loading it is an error.
#pragma once

namespace gtp::topology::internal {

inline constexpr const char* kPuWithoutCompleteCpuset = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">
    <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2" local_memory="1024"/>
    <object type="PU" os_index="0" cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3"/>
    <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4"/>
  </object>
</topology>
)";

}  // namespace gtp::topology::internal

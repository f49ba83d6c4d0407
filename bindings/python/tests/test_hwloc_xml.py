"""A profile naming hwloc XML that crashes hwloc 2.9 (a PU without complete_cpuset): gtp.Context
raises naming the file instead of the interpreter dying with SIGSEGV (docs/reliability.md)."""
import json

import pytest

import gtp

# The XML of topology/internal/crashing_hwloc_xml.h (the C++ tests').
CRASHING_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">
    <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2" local_memory="1024"/>
    <object type="PU" os_index="0" cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3"/>
    <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4"/>
  </object>
</topology>
"""




def test_profile_with_hwloc_xml_that_crashes_hwloc_raises_naming_it(tmp_path):
    (tmp_path / "crash.xml").write_text(CRASHING_XML)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema_version": 1, "cluster": {"hwloc_xml": "crash.xml"},
                                   "parallel": {"world_size": 1}}))
    with pytest.raises(gtp.GtpError, match=r"/cluster/hwloc_xml: .*hwloc crashed with signal 11 .*crash\.xml"):
        gtp.Context(gtp.FileStore(str(tmp_path / "store")), 0, 1, profile_path=str(profile))
    # The interpreter survived and libgtp still works; the repaired XML loads (and has no GPU).
    fixed = CRASHING_XML.replace('cpuset="0x00000001" nodeset', 'cpuset="0x00000001" complete_cpuset="0x00000001" nodeset')
    (tmp_path / "crash.xml").write_text(fixed)
    with pytest.raises(gtp.GtpError, match="the cluster has 0"):
        gtp.Context(gtp.FileStore(str(tmp_path / "store2")), 0, 1, profile_path=str(profile))
    with gtp.Context(gtp.FileStore(str(tmp_path / "store3")), 0, 1) as ctx:
        assert ctx.world_size == 1

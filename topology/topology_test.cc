#include "topology/topology.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "topology/discovery.h"
#include "topology/internal/test_clusters.h"
#include "topology/internal/test_fixtures.h"

namespace gtp::topology {
namespace {

using nlohmann::json;

HostTopology power8() { return load_hwloc_xml(internal::hwloc_fixture_dir() + "/power8gpudistances.xml"); }

TEST(HostRecord, JsonRoundTripKeepsEveryField) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const HostTopology host = power8();
  const json record = host;
  const HostTopology back = record.get<HostTopology>();
  EXPECT_EQ(json(back), record);
  EXPECT_EQ(back.gpus.size(), 4u);
  EXPECT_EQ(back.gpus[2].nvlink_domain, host.gpus[2].nvlink_domain);
  EXPECT_DOUBLE_EQ(back.gpus[0].nvlink_gbytes_per_s_to("0003:01:00.0"), 40);
  EXPECT_EQ(record["gpus"][0]["bus_id"], "0002:01:00.0");
  EXPECT_EQ(record["numa_nodes"][1]["memory_bytes"], 68450713600u);
}

TEST(HostRecord, StrictParsing) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  json record = power8();
  record["gpus"][0]["nvlink"][0]["gbytes_per_s"] = "fast";
  try {
    parse_host(record, "/records/3");
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()),
              "/records/3/gpus/0/nvlink/0/gbytes_per_s: expected a number, got string \"fast\": write a number");
  }
  record = power8();
  record["gpus"][0]["bus"] = "x";
  EXPECT_THROW(record.get<HostTopology>(), std::invalid_argument);
  EXPECT_THROW(json::array().get<HostTopology>(), std::invalid_argument);
}

TEST(ClusterView, RecordsFromEveryRankCollapsePerHost) {
  HostTopology a = internal::dgx_h100_host(), b = internal::dgx_h100_host();
  a.hostname = "a";
  b.hostname = "b";
  const std::string ra = json(a).dump(), rb = json(b).dump();
  const Cluster cluster = Cluster::from_records({ra, ra, rb, ra, rb});
  ASSERT_EQ(cluster.hosts().size(), 2u);
  EXPECT_EQ(cluster.gpu_count(), 16);
  EXPECT_EQ(cluster.hosts()[1].hostname, "b");
  EXPECT_EQ(cluster.slot_host(9), 1);
  EXPECT_EQ(cluster.slot_gpu(9), 1);
  EXPECT_EQ(json(cluster)["hosts"].size(), 2u);
  EXPECT_EQ(json(cluster).get<Cluster>().gpu_count(), 16);

  HostTopology changed = a;
  changed.gpus.pop_back();
  try {
    Cluster::from_records({ra, rb, json(changed).dump()});
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("/records/2: host 'a' sent a record that differs"), std::string::npos);
  }
  EXPECT_THROW(Cluster::from_records({"{not json"}), std::invalid_argument);
}

TEST(ClusterView, RejectsAmbiguousHosts) {
  HostTopology a = internal::dgx_h100_host();
  a.hostname = "a";
  EXPECT_THROW(Cluster({a, a}), std::invalid_argument);
  HostTopology dup = a;
  dup.gpus[1].index = 0;
  EXPECT_THROW(Cluster({dup}), std::invalid_argument);
  a.hostname = "";
  EXPECT_THROW(Cluster({a}), std::invalid_argument);
}

TEST(ClusterView, NvlinkDomainsSpanHostsInRacks) {
  const Cluster cluster = internal::nvl72_cluster(2);
  EXPECT_EQ(cluster.hosts().size(), 36u);
  EXPECT_EQ(cluster.hosts()[17].hostname, "tray17");
  EXPECT_EQ(cluster.gpu_count(), 144);
  EXPECT_EQ(cluster.domain_count(), 2);
  EXPECT_EQ(cluster.slot_domain(0), cluster.slot_domain(71));
  EXPECT_NE(cluster.slot_domain(71), cluster.slot_domain(72));
  EXPECT_EQ(cluster.slot(72).nvlink_domain, "nvl1/nvswitch");

  // GPUs without NVLink each get a domain of their own; per-host domains stay per host.
  ClusterTemplate shape;
  shape.host_count = 2;
  shape.host = internal::dgx_h100_host();
  shape.host.gpus[7].nvlink_domain.clear();
  const Cluster dgx = make_cluster(shape);
  EXPECT_EQ(dgx.domain_count(), 4);  // node0/nvswitch, node0 GPU 7, node1/nvswitch, node1 GPU 7
  EXPECT_EQ(dgx.slot(0).nvlink_domain, "node0/nvswitch");
  EXPECT_THROW(make_cluster(ClusterTemplate{0, 1, "n", {}}), std::invalid_argument);
}

TEST(HostRecord, ReadableTable) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const std::string table = format_host(power8());
  EXPECT_NE(table.find("host drac-12.grenoble.grid5000.fr"), std::string::npos) << table;
  EXPECT_NE(table.find("packages: 2   NUMA nodes: 2   GPUs: 4   NICs: 0"), std::string::npos) << table;
  EXPECT_NE(table.find("0003:01:00.0"), std::string::npos);
  EXPECT_NE(table.find("gpu 0003:01:00.0=40"), std::string::npos) << table;
}

}  // namespace
}  // namespace gtp::topology

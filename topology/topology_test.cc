#include "topology/topology.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// A host of two NVLinked GPUs (NVSwitch) to break one field at a time.
json two_gpu_host() {
  return json::parse(R"({"hostname": "h", "numa_nodes": [{"os_index": 0, "cpuset": "0x000000ff,,0xffffffff"}],
    "gpus": [{"index": 0, "bus_id": "0000:1b:00.0", "cpuset": "0xff", "nvlink_domain": "d",
              "nvlink": [{"peer_kind": "gpu", "peer": "0000:43:00.0", "gbytes_per_s": 100},
                         {"peer_kind": "cpu", "peer": "package:0", "gbytes_per_s": 50}]},
             {"index": 1, "bus_id": "0000:43:00.0", "nvlink_domain": "d",
              "nvlink": [{"peer_kind": "nvswitch", "peer": "sw", "gbytes_per_s": 450}]}],
    "nics": [{"name": "mlx5_0", "bus_id": "0000:4a:00.0"}]})");
}

std::string host_error(const json& record) {
  try {
    parse_host(record, "/cluster/hosts/2");
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

// Repeats and malformed strings used to be taken as given (a repeated NVLink entry doubled the
// predicted bandwidth); each is refused naming its JSON pointer.
TEST(HostRecord, RepeatsMalformedStringsAndUnlinkedDomainsAreRefused) {
  EXPECT_EQ(host_error(two_gpu_host()), "");
  json sparse = two_gpu_host();  // hwloc's own forms: empty (zero) words, "0x" on every word
  sparse["gpus"][0]["cpuset"] = "0x1,,,0x00000002";
  sparse["gpus"][1]["numa_node"] = -1;  // unknown
  EXPECT_EQ(host_error(sparse), "");
  const auto broken = [](const std::function<void(json&)>& edit) {
    json record = two_gpu_host();
    edit(record);
    return host_error(record);
  };
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& h) { h["gpus"][1]["index"] = 0; }, "/cluster/hosts/2/gpus/1/index: GPU index 0 is listed twice (first at /cluster/hosts/2/gpus/0)"},
      {[](json& h) { h["numa_nodes"].push_back({{"os_index", 0}}); }, "/cluster/hosts/2/numa_nodes/1/os_index: NUMA node 0 is listed twice"},
      {[](json& h) { h["nics"].push_back({{"name", "mlx5_0"}}); }, "/cluster/hosts/2/nics/1/name: NIC 'mlx5_0' is listed twice"},
      {[](json& h) { h["gpus"][1]["nvlink"].push_back(h["gpus"][1]["nvlink"][0]); },
       "/cluster/hosts/2/gpus/1/nvlink/1: nvswitch 'sw' is listed twice (first at nvlink/0), which would double"},
      {[](json& h) { h["numa_nodes"][0]["cpuset"] = "0-7"; }, "/cluster/hosts/2/numa_nodes/0/cpuset: '0-7' is not an hwloc cpuset"},
      {[](json& h) { h["gpus"][0]["cpuset"] = "0xff,0x123456789"; }, "/cluster/hosts/2/gpus/0/cpuset"},
      {[](json& h) { h["gpus"][0]["cpuset"] = "0x1,,,0x"; }, "/cluster/hosts/2/gpus/0/cpuset: '0x1,,,0x' is not"},
      {[](json& h) { h["gpus"][1]["numa_node"] = 7; },
       "/cluster/hosts/2/gpus/1/numa_node: NUMA node 7 is not among the host's numa_nodes (0"},
      {[](json& h) { h["nics"][0]["numa_node"] = 3; }, "/cluster/hosts/2/nics/0/numa_node: NUMA node 3 is not among"},
      {[](json& h) { h["gpus"][0]["bus_id"] = "0000:1B:00.0"; }, "/cluster/hosts/2/gpus/0/bus_id: '0000:1B:00.0' is not a PCI bus id"},
      {[](json& h) { h["nics"][0]["bus_id"] = "4a:00.0"; }, "/cluster/hosts/2/nics/0/bus_id"},
      {[](json& h) { h["gpus"][0]["nvlink"][0]["peer"] = "gpu1"; }, "/cluster/hosts/2/gpus/0/nvlink/0/peer: 'gpu1' is not a GPU bus id"},
      {[](json& h) { h["gpus"][0]["nvlink"][1]["peer"] = "socket0"; }, "/cluster/hosts/2/gpus/0/nvlink/1/peer: 'socket0' is not a CPU package"},
      {[](json& h) { h["gpus"][1]["nvlink"] = json::array(); },
       "/cluster/hosts/2/gpus/1/nvlink_domain: GPU 1 is in NVLink domain 'd' but has no NVLink"},
      {[](json& h) { h["gpus"][1]["nvlink_domain"] = "e"; },  // GPU 0's only GPU link now leaves its domain
       "/cluster/hosts/2/gpus/0/nvlink_domain: GPU 0 is in NVLink domain 'd'"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string error = broken(edit);
    EXPECT_NE(error.find(message), std::string::npos) << "expected: " << message << "\n     got: " << error;
  }
}

// Records arrive from peers: deep nesting, repeated keys and garbage are errors naming the record.
TEST(ClusterView, MalformedRecordsAreRefusedNamingTheRecord) {
  const std::string good = two_gpu_host().dump();
  const auto error_of = [](const std::vector<std::string>& records) {
    try {
      Cluster::from_records(records);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of({good}), "");
  EXPECT_NE(error_of({good, std::string(100000, '[')}).find("/records/1: nesting deeper than 64"), std::string::npos);
  EXPECT_NE(error_of({R"({"hostname": "a", "hostname": "b"})"}).find("/records/0: /hostname: duplicate key"),
            std::string::npos);
  EXPECT_NE(error_of({"{"}).find("/records/0 is not valid JSON"), std::string::npos);
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

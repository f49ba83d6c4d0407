#include "topology/planner.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "topology/discovery.h"
#include "topology/internal/test_clusters.h"
#include "topology/internal/test_fixtures.h"

namespace gtp::topology {
namespace {

using internal::dgx_h100_host;

ParallelSizes sizes(int world, int tp, int shards, int cp = 1, int pp = 1, int ep = 1, int etp = 0, int eshards = 0) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.tensor_parallel_num_weight_shards = shards;
  c.context_parallel_size = cp;
  c.pipeline_model_parallel_size = pp;
  c.expert_model_parallel_size = ep;
  c.expert_tensor_parallel_size = etp;
  c.expert_tensor_parallel_num_weight_shards = eshards;
  return derive_sizes(c);
}

Cluster dgx(int hosts) {
  ClusterTemplate shape;
  shape.host_count = hosts;
  shape.host = dgx_h100_host();
  return make_cluster(shape);
}

Cluster fixture(const std::string& name) {
  std::vector<HostTopology> hosts{load_hwloc_xml(internal::hwloc_fixture_dir() + "/" + name)};
  return Cluster(std::move(hosts));
}

TEST(Planner, TwoDgxH100NodesTp2G4Dp2) {
  const Cluster cluster = dgx(2);
  const Plan plan = make_plan(cluster, sizes(16, 2, 8), ViolationPolicy::kFail);
  EXPECT_TRUE(plan.violations.empty());
  EXPECT_TRUE(plan.ok());
  EXPECT_FALSE(plan.permuted);
  ASSERT_EQ(plan.placement.size(), 16u);
  for (int rank = 0; rank < 16; ++rank) {
    EXPECT_EQ(plan.placement[rank].host, rank / 8);
    EXPECT_EQ(plan.placement[rank].gpu, rank % 8);
    EXPECT_EQ(plan.placement[rank].numa_node, (rank % 8) / 4);
  }
  const GroupPlan& gtp = plan.group("gtp_remat");
  EXPECT_EQ(gtp.key, "gtp_remat");
  EXPECT_EQ(gtp.groups.group(0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(gtp.worst_link, LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(gtp.min_gbytes_per_s, 450);  // the GPU's NVSwitch bandwidth
  EXPECT_EQ(gtp.bandwidth_source[0], "nvswitch links");
  const GroupPlan& dp = plan.group("dp");
  EXPECT_EQ(dp.groups.group(0), (std::vector<int>{0, 8}));
  EXPECT_EQ(dp.worst_link, LinkClass::kNetwork);
  EXPECT_DOUBLE_EQ(dp.min_gbytes_per_s, 50);  // 4 NICs x 50 GB/s shared by 4 GPUs per NUMA node
  EXPECT_EQ(plan.group("tp_gtp_remat").key, "gtp_remat-tp");
  EXPECT_EQ(plan.group("gtp_remat_dp").groups.group(0), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(plan.group("pp").worst_link, LinkClass::kLocal);
  // ncclCommSplit arguments: rank 5 is in gtp_remat group {1,3,5,7} at position 2.
  EXPECT_EQ(split_args(gtp, 5).color, 1);
  EXPECT_EQ(split_args(gtp, 5).key, 2);
  EXPECT_EQ(split_args(dp, 9).color, 1);
  EXPECT_EQ(split_args(dp, 9).key, 1);
  EXPECT_THROW(split_args(gtp, 16), std::invalid_argument);
  EXPECT_EQ(plan.group("ep").groups.num_groups(), 16);
}

TEST(Planner, TpTimesGtpLargerThanDomainViolatesUnderEveryPolicy) {
  const Cluster cluster = dgx(2);
  for (ViolationPolicy policy : {ViolationPolicy::kWarn, ViolationPolicy::kFail, ViolationPolicy::kPermute}) {
    const Plan plan = make_plan(cluster, sizes(16, 4, 16), policy);
    ASSERT_EQ(plan.violations.size(), 1u) << to_string(policy);
    const Violation& v = plan.violations[0];
    EXPECT_EQ(v.rule, "tp_gtp_remat_in_nvlink_domain");
    EXPECT_FALSE(v.resolved);
    EXPECT_NE(v.reason.find("tp*gtp_remat=16 is larger than the largest NVLink domain (8 GPUs)"), std::string::npos)
        << v.reason;
    EXPECT_EQ(plan.ok(), policy == ViolationPolicy::kWarn);
    EXPECT_EQ(plan.group("tp_gtp_remat").worst_link, LinkClass::kNetwork);
  }
}

TEST(Planner, Nvl72Gtp64PermutesWholeGroupsIntoRacks) {
  // Megatron's GB200 example: GTP64 (tp 4 x gtp_remat 16), EP64, EGTP2, on two racks using 64 of 72 GPUs each.
  const Cluster cluster = internal::nvl72_cluster(2);
  const ParallelSizes s = sizes(128, 4, 64, 1, 1, 64, 1, 2);
  const Plan launcher = make_plan(cluster, s, ViolationPolicy::kFail);
  ASSERT_EQ(launcher.violations.size(), 2u);  // group 1 of tp_gtp_remat and of tp_ep straddle racks
  EXPECT_EQ(launcher.violations[0].group_index, 1);
  EXPECT_NE(launcher.violations[0].reason.find("has 72 GPUs, not a multiple of tp*gtp_remat=64"), std::string::npos)
      << launcher.violations[0].reason;
  EXPECT_EQ(launcher.violations[1].rule, "ep_in_nvlink_domain");
  EXPECT_FALSE(launcher.ok());

  const Plan plan = make_plan(cluster, s, ViolationPolicy::kPermute);
  EXPECT_TRUE(plan.permuted);
  EXPECT_TRUE(plan.ok());
  ASSERT_EQ(plan.violations.size(), 2u);
  for (const Violation& v : plan.violations) EXPECT_TRUE(v.resolved) << v.reason;
  EXPECT_EQ(plan.placement[63].slot, 63);
  EXPECT_EQ(plan.placement[64].slot, 72);  // rank 64 starts rack 1
  EXPECT_EQ(plan.group("tp_gtp_remat").worst_link, LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(plan.group("tp_gtp_remat").min_gbytes_per_s, 900);
  EXPECT_EQ(plan.group("ep").worst_link, LinkClass::kNvlink);
  EXPECT_EQ(plan.group("expt_gtp_remat").worst_link, LinkClass::kNetwork);  // EGTP2 crosses racks over IB
  EXPECT_EQ(plan.group("dp").worst_link, LinkClass::kNetwork);
  bool unused_noted = false;
  for (const std::string& note : plan.notes) unused_noted |= note == "16 of 144 GPUs are left unused";
  EXPECT_TRUE(unused_noted);
  std::set<int> slots;
  for (const RankPlacement& p : plan.placement) slots.insert(p.slot);
  EXPECT_EQ(slots.size(), 128u);  // a permutation: every rank on its own GPU
  const std::vector<int> by_slot = plan.rank_by_slot(cluster.gpu_count());
  EXPECT_EQ(by_slot[72], 64);
  EXPECT_EQ(by_slot[64], -1);  // the 8 spare GPUs of rack 0
  EXPECT_EQ(by_slot[143], -1);
  for (int rank = 0; rank < 128; ++rank) EXPECT_EQ(by_slot[plan.placement[rank].slot], rank);
}

TEST(Planner, InterleavedHostOrderIsFixedByPermute) {
  // Two NVLink domains of two 4-GPU hosts each, listed A0 B0 A1 B1.
  ClusterTemplate shape;
  shape.host_count = 4;
  shape.hosts_per_nvlink_domain = 2;
  shape.host = internal::gb200_tray_host();
  std::vector<HostTopology> hosts = make_cluster(shape).hosts();
  std::swap(hosts[1], hosts[2]);
  const Cluster cluster(hosts);
  const ParallelSizes s = sizes(16, 2, 8);  // blocks of 8 = one domain
  const Plan warn = make_plan(cluster, s, ViolationPolicy::kWarn);
  ASSERT_EQ(warn.violations.size(), 2u);
  EXPECT_NE(warn.violations[0].reason.find("interleaves NVLink domains"), std::string::npos) << warn.violations[0].reason;
  EXPECT_TRUE(warn.ok());
  const Plan fixed = make_plan(cluster, s, ViolationPolicy::kPermute);
  EXPECT_TRUE(fixed.ok());
  EXPECT_EQ(fixed.unresolved_violations(), 0);
  EXPECT_EQ(fixed.placement[4].host, 2);  // rank 4 goes to the second host of domain 0 (listed third)
}

TEST(Planner, ContextParallelStaysInDomainWhenItFits) {
  const Cluster cluster = dgx(2);
  const Plan fits = make_plan(cluster, sizes(16, 2, 4, /*cp=*/2), ViolationPolicy::kFail);
  EXPECT_TRUE(fits.violations.empty());
  EXPECT_EQ(fits.group("cp").worst_link, LinkClass::kNvlink);
  const Plan too_big = make_plan(cluster, sizes(16, 2, 4, /*cp=*/4), ViolationPolicy::kFail);
  EXPECT_TRUE(too_big.violations.empty());
  ASSERT_FALSE(too_big.notes.empty());
  EXPECT_NE(too_big.notes[0].find("tp*gtp_remat*cp=16 exceeds the smallest NVLink domain (8 GPUs)"), std::string::npos);
  EXPECT_EQ(too_big.group("cp").worst_link, LinkClass::kNetwork);
}

TEST(Planner, Power8BandwidthComesFromTheNvlinkMatrix) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const Cluster cluster = fixture("power8gpudistances.xml");
  const Plan plan = make_plan(cluster, sizes(4, 2, 2), ViolationPolicy::kFail);
  EXPECT_TRUE(plan.violations.empty());
  const GroupPlan& tp = plan.group("tp");
  EXPECT_EQ(tp.worst_link, LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(tp.gbytes_per_s[0], 40);  // 40000 MB/s between GPU 0 and 1
  EXPECT_DOUBLE_EQ(tp.gbytes_per_s[1], 40);
  EXPECT_EQ(tp.bandwidth_source[0], "nvlink matrix");
  const GroupPlan& dp = plan.group("dp");  // {0,2}: no NVLink between the pairs, same host
  EXPECT_EQ(dp.worst_link, LinkClass::kPcie);
  EXPECT_NEAR(dp.min_gbytes_per_s, 15.753846, 1e-4);

  const Plan too_wide = make_plan(cluster, sizes(4, 2, 4), ViolationPolicy::kPermute);
  ASSERT_EQ(too_wide.violations.size(), 1u);
  EXPECT_NE(too_wide.violations[0].reason.find("larger than the largest NVLink domain (2 GPUs)"), std::string::npos);
  EXPECT_FALSE(too_wide.ok());
}

TEST(Planner, PcieOnlyGpusCannotHostTpGroups) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const Cluster cluster = fixture("32em64t-2n8c2t-pci-normalio.xml");
  const Plan dp_only = make_plan(cluster, sizes(3, 1, 1), ViolationPolicy::kFail);
  EXPECT_TRUE(dp_only.ok());
  EXPECT_EQ(dp_only.group("dp").worst_link, LinkClass::kPcie);
  EXPECT_EQ(dp_only.group("dp").bandwidth_source[0], "pcie link (rate unknown)");  // the file records 0 GB/s
  const Plan tp = make_plan(cluster, sizes(3, 3, 3), ViolationPolicy::kFail);
  ASSERT_EQ(tp.violations.size(), 1u);
  EXPECT_NE(tp.violations[0].reason.find("has no NVLink"), std::string::npos) << tp.violations[0].reason;
}

// The group's first GPU lacks NVLink: the message named "rank 0 ... rank 0" as the pair that differs.
TEST(Planner, AFirstRankWithoutNvlinkIsNamedOnce) {
  HostTopology host;
  host.hostname = "h0";
  host.gpus.resize(2);
  host.gpus[0].index = 0;
  host.gpus[1].index = 1;
  host.gpus[1].nvlink = {NvlinkPeer{"nvswitch", "sw", 450}};
  host.gpus[1].nvlink_domain = "h0/nvswitch";
  const Plan plan = make_plan(Cluster({host}), sizes(2, 2, 2), ViolationPolicy::kFail);
  ASSERT_EQ(plan.violations.size(), 1u);
  const std::string& reason = plan.violations[0].reason;
  EXPECT_NE(reason.find("not inside one NVLink domain: rank 0 is on h0 in none (h0 GPU 0 has no NVLink); GPU 0 of h0"),
            std::string::npos) << reason;
  EXPECT_EQ(reason.find("rank 0 on"), std::string::npos) << reason;
}

TEST(Planner, RejectsWorldLargerThanCluster) {
  try {
    make_plan(dgx(1), sizes(16, 2, 2), ViolationPolicy::kWarn);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("world_size=16 needs that many GPUs but the cluster has 8"),
              std::string::npos);
  }
  EXPECT_EQ(parse_violation_policy("permute"), ViolationPolicy::kPermute);
  EXPECT_THROW(parse_violation_policy("ignore"), std::invalid_argument);
}

TEST(Planner, JsonAndTableReports) {
  const Cluster cluster = dgx(2);
  const Plan plan = make_plan(cluster, sizes(16, 2, 8), ViolationPolicy::kWarn);
  const nlohmann::json j = plan_to_json(plan, cluster);
  EXPECT_EQ(j["sizes"]["gtp_remat"], 4);
  EXPECT_EQ(j["placement"].size(), 16u);
  EXPECT_EQ(j["placement"][9]["host"], "node1");
  EXPECT_EQ(j["placement"][9]["cpuset"], "0x0000ffff");
  EXPECT_EQ(j["groups"].size(), standard_groups().size());
  EXPECT_EQ(j["groups"][1]["name"], "gtp_remat");
  EXPECT_EQ(j["groups"][1]["groups"][0]["ranks"], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(j["groups"][1]["groups"][0]["link"], "nvlink");
  EXPECT_TRUE(j["ok"].get<bool>());
  const std::string table = format_plan(plan, cluster, 4, 10);
  EXPECT_NE(table.find("gtp_remat           gtp_remat"), std::string::npos) << table;
  EXPECT_NE(table.find("... 12 more ranks"), std::string::npos);
  EXPECT_NE(table.find("violations: 0 (0 unresolved)"), std::string::npos);
}

}  // namespace
}  // namespace gtp::topology

// Plans a 100 000-GPU GB200 NVL72 cluster once and checks the result (the timing lives in
// planner_benchmark.cc).
#include <gtest/gtest.h>

#include <vector>

#include "topology/internal/test_clusters.h"
#include "topology/planner.h"

namespace gtp::topology {
namespace {

TEST(PlannerScale, HundredThousandGpusOnNvl72Racks) {
  const Cluster cluster = internal::nvl72_cluster(1389);  // 100 008 GPUs
  ParallelConfig config;
  config.world_size = 100000;
  config.tensor_model_parallel_size = 4;
  config.tensor_parallel_num_weight_shards = 8;  // G = 2
  config.pipeline_model_parallel_size = 4;
  config.expert_model_parallel_size = 8;
  config.expert_tensor_parallel_size = 1;
  const ParallelSizes sizes = derive_sizes(config);
  ASSERT_EQ(sizes.dp, 3125);
  const Plan plan = make_plan(cluster, sizes, ViolationPolicy::kFail);
  EXPECT_TRUE(plan.ok());
  EXPECT_TRUE(plan.violations.empty());
  ASSERT_EQ(plan.placement.size(), 100000u);
  std::vector<char> used(cluster.gpu_count(), 0);
  for (const RankPlacement& p : plan.placement) {
    ASSERT_FALSE(used[p.slot]);
    used[p.slot] = 1;
  }
  const GroupPlan& gtp = plan.group("tp_gtp_remat");
  EXPECT_EQ(gtp.groups.num_groups(), 12500);
  EXPECT_EQ(gtp.worst_link, LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(gtp.min_gbytes_per_s, 900);
  EXPECT_EQ(plan.group("ep").worst_link, LinkClass::kNvlink);
  const GroupPlan& dp = plan.group("dp");
  EXPECT_EQ(dp.groups.group_size, 3125);
  EXPECT_EQ(dp.worst_link, LinkClass::kNetwork);
  EXPECT_DOUBLE_EQ(dp.min_gbytes_per_s, 50);
  EXPECT_EQ(plan.group("pp").groups.group(0), (std::vector<int>{0, 25000, 50000, 75000}));
}

}  // namespace
}  // namespace gtp::topology

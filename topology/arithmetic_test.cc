#include "topology/arithmetic.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

namespace gtp::topology {
namespace {

std::string error_of(const ParallelConfig& config) {
  try {
    derive_sizes(config);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

ParallelConfig config(int world, int tp, int shards) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.tensor_parallel_num_weight_shards = shards;
  return c;
}

TEST(Arithmetic, DerivesRematSizesAndReplicateDp) {
  ParallelConfig c = config(64, 2, 8);
  c.pipeline_model_parallel_size = 2;
  c.expert_model_parallel_size = 8;
  c.expert_tensor_parallel_size = 1;
  c.expert_tensor_parallel_num_weight_shards = 2;
  const ParallelSizes s = derive_sizes(c);
  EXPECT_EQ(s.gtp_weight_remat_size(), 4);
  EXPECT_EQ(s.expert_gtp_weight_remat_size(), 2);
  EXPECT_EQ(s.dp, 4);        // 64 / (2*4*1*2)
  EXPECT_EQ(s.expt_dp, 2);   // 64 / (1*8*2*2)
  EXPECT_EQ(s.data_ranks(), 16);
  EXPECT_TRUE(s.gtp_active());
}

TEST(Arithmetic, UnsetShardsMeanGtpOff) {
  const ParallelSizes s = derive_sizes(config(16, 4, 0));
  EXPECT_EQ(s.gtp_remat, 1);
  EXPECT_EQ(s.expt_tp, 4);  // expert TP follows TP when unset
  EXPECT_EQ(s.expt_gtp_remat, 1);
  EXPECT_EQ(s.tensor_parallel_num_weight_shards, 4);
  EXPECT_EQ(s.dp, 4);
  EXPECT_FALSE(s.gtp_active());
}

TEST(Arithmetic, ActionableMessages) {
  EXPECT_EQ(error_of(config(64, 8, 12)),
            "tensor_parallel_num_weight_shards=12 is not divisible by tensor_model_parallel_size=8: choose a "
            "multiple of 8 (e.g. 16)");
  EXPECT_NE(error_of(config(64, 8, 4)).find("tensor_parallel_num_weight_shards=4 is smaller than "
                                            "tensor_model_parallel_size=8"),
            std::string::npos);
  EXPECT_EQ(error_of(config(20, 2, 8)),
            "world_size=20 is not divisible by tp*gtp_remat*cp*pp (2*4*1*1) = 8: use a world size that is a "
            "multiple of 8 or reduce those sizes");
  ParallelConfig expert = config(16, 2, 2);
  expert.expert_model_parallel_size = 3;
  EXPECT_NE(error_of(expert).find("expt_tp*ep*expt_gtp_remat*pp (2*3*1*1) = 6"), std::string::npos);
  ParallelConfig eshards = config(16, 2, 2);
  eshards.expert_tensor_parallel_size = 2;
  eshards.expert_tensor_parallel_num_weight_shards = 3;
  EXPECT_NE(error_of(eshards).find("expert_tensor_parallel_num_weight_shards=3 is not divisible by "
                                   "expert_tensor_parallel_size=2"),
            std::string::npos);
  EXPECT_NE(error_of(config(0, 1, 0)).find("world_size=0 is invalid"), std::string::npos);
  ParallelConfig cp = config(8, 1, 0);
  cp.context_parallel_size = -2;
  EXPECT_NE(error_of(cp).find("context_parallel_size=-2"), std::string::npos);
  EXPECT_NE(error_of(config(8, 2, -4)).find("negative"), std::string::npos);
}

TEST(Arithmetic, DataRanksFollowGtpRematDpGroups) {
  // 8 GPUs, TP=2, G=2, DP=2: the data group {0,2,4,6} reads microbatches 0..3 in that order.
  const ParallelSizes s = derive_sizes(config(8, 2, 4));
  const int expected_index[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int rank = 0; rank < 8; ++rank) {
    const DataParallelRank d = data_parallel_rank(s, rank);
    EXPECT_EQ(d.index, expected_index[rank]) << rank;
    EXPECT_EQ(d.count, 4);
  }
  HyperCommGrid grid = make_gtp_grid(s);
  const RankGroups groups = grid.rank_enum({"gtp_remat", "dp"});
  for (int g = 0; g < groups.num_groups(); ++g) {
    const std::vector<int> members = groups.group(g);
    for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(data_parallel_rank(s, members[i]).index, int(i));
  }
  EXPECT_THROW(data_parallel_rank(s, 8), std::invalid_argument);
}

TEST(Arithmetic, DataRanksWithContextParallel) {
  // CP ranks split one sample's sequence: same data index, and DP x G distinct indices overall.
  ParallelConfig c = config(32, 2, 4);
  c.context_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  const ParallelSizes s = derive_sizes(c);
  ASSERT_EQ(s.dp, 2);
  HyperCommGrid grid = make_gtp_grid(s);
  for (int rank = 0; rank < 32; ++rank) {
    for (int peer : grid.group_of(rank, {"cp"})) EXPECT_EQ(data_parallel_rank(s, peer).index, data_parallel_rank(s, rank).index);
    for (int peer : grid.group_of(rank, {"tp"})) EXPECT_EQ(data_parallel_rank(s, peer).index, data_parallel_rank(s, rank).index);
  }
  std::set<int> indices;
  for (int rank = 0; rank < 32; ++rank) indices.insert(data_parallel_rank(s, rank).index);
  EXPECT_EQ(indices.size(), 4u);
}

TEST(Arithmetic, BatchAccountingCountsGtpPeers) {
  const ParallelSizes s = derive_sizes(config(8, 2, 4));  // DP=2, G=2
  const BatchAccounting a = batch_accounting(s, 32, 2);
  EXPECT_EQ(a.num_microbatches, 4);  // 32 / (2 * 2 * 2)
  EXPECT_EQ(a.samples_per_step, 32);
  try {
    batch_accounting(s, 30, 2);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("global_batch_size=30 is not divisible by micro_batch_size*dp*gtp_remat"
                                             " = 2*2*2 = 8"),
              std::string::npos);
  }
}

TEST(Arithmetic, PaddingRoundsToAlignmentTimesG) {
  EXPECT_EQ(alignment_rows(WireFormat::kBf16), 16);
  EXPECT_EQ(alignment_rows(WireFormat::kFp8), 16);
  EXPECT_EQ(alignment_rows(WireFormat::kNvfp4), 16);
  EXPECT_EQ(alignment_rows(WireFormat::kMxfp8), 32);
  ShardPadding p = shard_padding(1000, 4, WireFormat::kBf16);  // align 64 -> 1024
  EXPECT_EQ(p.padded_rows, 1024);
  EXPECT_EQ(p.pad_rows, 24);
  EXPECT_EQ(p.shard_rows, 256);
  p = shard_padding(1000, 4, WireFormat::kMxfp8);  // align 128 -> 1024
  EXPECT_EQ(p.padded_rows, 1024);
  p = shard_padding(1100, 4, WireFormat::kMxfp8);  // 1100 -> 1152
  EXPECT_EQ(p.padded_rows, 1152);
  EXPECT_EQ(p.shard_rows, 288);
  EXPECT_EQ(p.shard_rows % 32, 0);
  p = shard_padding(4096, 8, WireFormat::kNvfp4);  // already aligned
  EXPECT_EQ(p.pad_rows, 0);
  EXPECT_EQ(p.shard_rows, 512);
  p = shard_padding(1, 1, WireFormat::kFp8);
  EXPECT_EQ(p.padded_rows, 16);
  EXPECT_THROW(shard_padding(0, 4, WireFormat::kBf16), std::invalid_argument);
  EXPECT_THROW(shard_padding(16, 0, WireFormat::kBf16), std::invalid_argument);
  EXPECT_EQ(parse_wire_format("mxfp8"), WireFormat::kMxfp8);
  EXPECT_STREQ(to_string(WireFormat::kNvfp4), "nvfp4");
  EXPECT_THROW(parse_wire_format("fp4"), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::topology

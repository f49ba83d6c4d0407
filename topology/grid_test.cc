#include "topology/grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include "topology/arithmetic.h"

namespace gtp::topology {
namespace {

using Lists = std::vector<std::vector<int>>;

// Independent model of Megatron's mechanics: lay the ranks out as a C-order array over the REVERSED
// names, move the requested axes to the end (keeping reversed order) and read the array in C order.
Lists megatron_reference(const std::vector<int>& shape, const std::vector<bool>& requested, int offset) {
  const int n = static_cast<int>(shape.size());
  std::vector<int> stride(n, 1);
  for (int i = 1; i < n; ++i) stride[i] = stride[i - 1] * shape[i - 1];
  std::vector<int> axes;  // transposed axis order, slowest first
  for (int i = n - 1; i >= 0; --i)
    if (!requested[i]) axes.push_back(i);
  int group_size = 1;
  for (int i = n - 1; i >= 0; --i)
    if (requested[i]) {
      axes.push_back(i);
      group_size *= shape[i];
    }
  std::vector<int> index(n, 0), flat;
  while (true) {
    int rank = offset;
    for (int i = 0; i < n; ++i) rank += index[axes[i]] * stride[axes[i]];
    flat.push_back(rank);
    int k = n - 1;  // C order: the last transposed axis moves fastest
    while (k >= 0 && ++index[axes[k]] == shape[axes[k]]) index[axes[k--]] = 0;
    if (k < 0) break;
  }
  Lists lists;
  for (size_t i = 0; i < flat.size(); i += group_size) lists.emplace_back(flat.begin() + i, flat.begin() + i + group_size);
  return lists;
}

std::vector<std::string> subset(const std::vector<std::string>& names, unsigned mask) {
  std::vector<std::string> dims;
  for (size_t i = 0; i < names.size(); ++i)
    if (mask & (1u << i)) dims.push_back(names[i]);
  return dims;
}

TEST(GridGolden, MegatronShape2345) {
  // topology-abi-style.md §1.3: shape [2,3,4,5] over tp,cp,pp,dp; rank = tp + 2cp + 6pp + 24dp.
  HyperCommGrid grid({2, 3, 4, 5}, {"tp", "cp", "pp", "dp"});
  const Lists tp = grid.rank_enum({"tp"}).to_lists();
  ASSERT_EQ(tp.size(), 60u);
  EXPECT_EQ(tp[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(tp[1], (std::vector<int>{2, 3}));
  const Lists dp = grid.rank_enum({"dp"}).to_lists();
  ASSERT_EQ(dp.size(), 24u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 24, 48, 72, 96}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 25, 49, 73, 97}));
  EXPECT_EQ(grid.rank_enum({"tp", "cp"}).group(0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // create_pg orders the dims first, so the request order does not matter.
  EXPECT_EQ(grid.rank_enum({"cp", "tp"}).ranks, grid.rank_enum({"tp", "cp"}).ranks);
  EXPECT_EQ(grid.coords(1 + 2 * 2 + 6 * 3 + 24 * 4), (std::vector<int>{1, 2, 3, 4}));
}

TEST(GridGolden, GtpOrderTp2Remat4Dp2) {
  HyperCommGrid grid({2, 4, 1, 1, 2, 1}, {"tp", "gtp_remat", "cp", "ep", "dp", "pp"});
  EXPECT_EQ(grid.rank_enum({"gtp_remat"}).to_lists(),
            (Lists{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.rank_enum({"tp", "gtp_remat"}).to_lists(),
            (Lists{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  const Lists dp = grid.rank_enum({"dp"}).to_lists();
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 9}));
  EXPECT_EQ(dp[7], (std::vector<int>{7, 15}));
}

TEST(GridGolden, EightGpuTp2G2Dp2FromAnatomy) {
  // gtp-anatomy.md §1.3: rank = tp + 2g + 4dp.
  ParallelConfig config;
  config.world_size = 8;
  config.tensor_model_parallel_size = 2;
  config.tensor_parallel_num_weight_shards = 4;
  HyperCommGrid grid = make_gtp_grid(derive_sizes(config));
  EXPECT_EQ(grid.rank_enum({"tp"}).to_lists(), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(grid.rank_enum({"gtp_remat"}).to_lists(), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(grid.rank_enum({"dp"}).to_lists(), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.rank_enum({"gtp_remat", "dp"}).to_lists(), (Lists{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(GridGolden, MegatronUnitTestShape24AndRankOffset) {
  HyperCommGrid grid({2, 4}, {"tp", "dp"});
  EXPECT_EQ(grid.rank_enum({"tp"}).to_lists(), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  HyperCommGrid shifted({2, 4}, {"tp", "dp"}, /*rank_offset=*/4, /*world_size=*/12);
  EXPECT_EQ(shifted.rank_enum({"tp"}).to_lists(), (Lists{{4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(shifted.rank_enum({"dp"}).to_lists(), (Lists{{4, 6, 8, 10}, {5, 7, 9, 11}}));
  EXPECT_THROW(HyperCommGrid({2, 4}, {"tp", "dp"}, 5, 12), std::invalid_argument);
}

TEST(GridKeys, ReversedNameOrderAndNoRecreation) {
  HyperCommGrid grid({2, 2, 2}, {"tp", "cp", "dp"});
  EXPECT_EQ(grid.canonical_key({"dp", "tp"}), "dp-tp");
  EXPECT_EQ(grid.canonical_key({"tp", "cp", "dp"}), "dp-cp-tp");
  EXPECT_FALSE(grid.has_group({"tp", "dp"}));
  EXPECT_THROW(grid.group({"tp"}), std::invalid_argument);
  const RankGroups& created = grid.create_group({"dp", "tp"});
  EXPECT_EQ(created.group(0), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_TRUE(grid.has_group({"tp", "dp"}));
  EXPECT_THROW(grid.create_group({"tp", "dp"}), std::invalid_argument);
  EXPECT_EQ(grid.group({"tp", "dp"}).ranks, created.ranks);
}

TEST(GridErrors, BadInputIsInvalidArgument) {
  EXPECT_THROW(HyperCommGrid({2, 2}, {"tp"}), std::invalid_argument);
  EXPECT_THROW(HyperCommGrid({2, 0}, {"tp", "dp"}), std::invalid_argument);
  EXPECT_THROW(HyperCommGrid({2, 2}, {"tp", "tp"}), std::invalid_argument);
  EXPECT_THROW(HyperCommGrid({2, 2}, {"tp", "d-p"}), std::invalid_argument);
  EXPECT_THROW(HyperCommGrid({}, {}), std::invalid_argument);
  EXPECT_THROW(HyperCommGrid({2, 2}, {"tp", "dp"}, 0, 3), std::invalid_argument);
  HyperCommGrid grid({2, 2}, {"tp", "dp"});
  EXPECT_THROW(grid.rank_enum({"pp"}), std::invalid_argument);
  EXPECT_THROW(grid.rank_enum({"tp", "tp"}), std::invalid_argument);
  EXPECT_THROW(grid.rank_enum({}), std::invalid_argument);
  EXPECT_THROW(grid.coords(4), std::invalid_argument);
  EXPECT_THROW(grid.rank_enum({"tp"}, "expert"), std::invalid_argument);
  try {
    grid.rank_enum({"pp"});
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("dims: tp, dp"), std::string::npos) << error.what();
  }
}

TEST(GridViews, DenseAndExpertShareOneSpan) {
  // Megatron's MIMO example: dense tp,gtp_remat,cp,dp,pp and expert expt_tp,ep,expt_gtp_remat,expt_dp,pp.
  ParallelConfig config;
  config.world_size = 64;
  config.tensor_model_parallel_size = 2;
  config.tensor_parallel_num_weight_shards = 8;
  config.pipeline_model_parallel_size = 2;
  config.expert_model_parallel_size = 4;
  config.expert_tensor_parallel_size = 1;
  config.expert_tensor_parallel_num_weight_shards = 2;
  HyperCommGrid grid = make_gtp_grid(derive_sizes(config), /*rank_offset=*/8);
  EXPECT_EQ(grid.layout(kExpertView).shape, (std::vector<int>{1, 4, 2, 4, 2}));
  EXPECT_EQ(grid.rank_enum({"pp"}).ranks, grid.rank_enum({"pp"}, kExpertView).ranks);
  EXPECT_EQ(grid.rank_enum({"ep"}, kExpertView).group(0), (std::vector<int>{8, 9, 10, 11}));
  EXPECT_EQ(grid.rank_enum({"expt_gtp_remat"}, kExpertView).group(0), (std::vector<int>{8, 12}));
  // Keys and creation are per view.
  grid.create_group({"pp"});
  EXPECT_NO_THROW(grid.create_group({"pp"}, kExpertView));
  EXPECT_EQ(grid.canonical_key({"ep", "expt_gtp_remat"}, kExpertView), "expt_gtp_remat-ep");

  HyperCommGrid base({2, 2, 2}, {"tp", "dp", "pp"});
  EXPECT_THROW(base.add_view("expert", {2, 2, 4}, {"ep", "edp", "pp"}, {"pp"}), std::invalid_argument);  // size
  EXPECT_THROW(base.add_view("expert", {2, 4}, {"ep", "pp"}, {"pp"}), std::invalid_argument);  // pp differs
  EXPECT_THROW(base.add_view("expert", {4, 2}, {"ep", "pp"}, {"cp"}), std::invalid_argument);  // unknown dim
  EXPECT_EQ(base.view_names().size(), 1u);  // failed views leave nothing behind
  base.add_view("expert", {4, 2}, {"ep", "pp"}, {"pp"});
  EXPECT_THROW(base.add_view("expert", {4, 2}, {"ep", "pp"}, {"pp"}), std::invalid_argument);
}

TEST(GridMesh, LastDimFastestMatchesDeviceMeshGroups) {
  // DeviceMesh: arange(prod).reshape(shape), row-major; a dim's groups vary that index with the
  // others fixed, enumerated row-major.
  const GridLayout mesh{{2, 3, 4}, {"dp", "cp", "tp"}};
  const GridLayout ours = from_last_dim_fastest(mesh);
  EXPECT_EQ(ours.dim_names, (std::vector<std::string>{"tp", "cp", "dp"}));
  EXPECT_EQ(ours.shape, (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(to_last_dim_fastest(ours).dim_names, mesh.dim_names);
  HyperCommGrid grid(ours.shape, ours.dim_names);
  for (int k = 0; k < 3; ++k) {
    Lists expected;
    for (int a = 0; a < (k == 0 ? 1 : 2); ++a)
      for (int b = 0; b < (k == 1 ? 1 : 3); ++b)
        for (int c = 0; c < (k == 2 ? 1 : 4); ++c) {
          std::vector<int> group;
          for (int step = 0; step < mesh.shape[k]; ++step) {
            int idx[3] = {a, b, c};
            idx[k] = step;
            group.push_back(idx[0] * 12 + idx[1] * 4 + idx[2]);
          }
          expected.push_back(group);
        }
    EXPECT_EQ(grid.rank_enum({mesh.dim_names[k]}).to_lists(), expected) << mesh.dim_names[k];
  }
}

class GridProperties : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(GridProperties, EverySubsetOfDims) {
  const std::vector<int> shape = GetParam();
  std::vector<std::string> names;
  for (size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
  const int offset = 3;
  HyperCommGrid grid(shape, names, offset, offset + std::accumulate(shape.begin(), shape.end(), 1,
                                                                    std::multiplies<int>()) + 5);
  const unsigned full = (1u << shape.size()) - 1;
  for (unsigned mask = 1; mask <= full; ++mask) {
    const std::vector<std::string> dims = subset(names, mask);
    const RankGroups groups = grid.rank_enum(dims);
    int expected_size = 1;
    std::vector<bool> requested(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      requested[i] = mask & (1u << i);
      if (requested[i]) expected_size *= shape[i];
    }
    ASSERT_EQ(groups.group_size, expected_size);
    ASSERT_EQ(groups.num_groups(), grid.size() / expected_size);
    EXPECT_EQ(groups.to_lists(), megatron_reference(shape, requested, offset));
    // Partition of [offset, offset + size).
    std::vector<int> sorted = groups.ranks;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> span(grid.size());
    std::iota(span.begin(), span.end(), offset);
    ASSERT_EQ(sorted, span);
    // Members agree on every coordinate outside dims; group_of finds the same group.
    for (int g = 0; g < groups.num_groups(); ++g) {
      const std::vector<int> members = groups.group(g);
      const std::vector<int> first = grid.coords(members[0]);
      for (int member : members) {
        const std::vector<int> c = grid.coords(member);
        for (size_t i = 0; i < shape.size(); ++i)
          if (!requested[i]) {
            ASSERT_EQ(c[i], first[i]);
          }
        ASSERT_EQ(grid.group_of(member, dims), members);
      }
    }
    // Disjoint dim sets meet in exactly the one rank they share.
    for (unsigned other = 1; other <= full; ++other) {
      if (other & mask) continue;
      const std::vector<std::string> other_dims = subset(names, other);
      for (int rank = offset; rank < offset + grid.size(); ++rank) {
        const std::vector<int> a = grid.group_of(rank, dims), b = grid.group_of(rank, other_dims);
        std::set<int> common;
        for (int x : a)
          if (std::find(b.begin(), b.end(), x) != b.end()) common.insert(x);
        ASSERT_EQ(common, std::set<int>{rank}) << grid.canonical_key(dims) << " vs " << grid.canonical_key(other_dims);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GridProperties,
                         ::testing::Values(std::vector<int>{1}, std::vector<int>{5}, std::vector<int>{2, 3},
                                           std::vector<int>{3, 1, 2}, std::vector<int>{2, 3, 4, 5},
                                           std::vector<int>{2, 2, 2, 2, 2}, std::vector<int>{4, 1, 3, 1, 2, 1},
                                           std::vector<int>{1, 1, 1}, std::vector<int>{7, 2},
                                           std::vector<int>{2, 4, 1, 3, 2}));

}  // namespace
}  // namespace gtp::topology

// GroupBootstrap over thread ranks: every collective inside groups that run side by side, groups in
// any order of their members, groups of different sizes moving different byte counts, and bad input.
#include "comm/group_bootstrap.h"

#include <gtest/gtest.h>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"

namespace gtp::comm {
namespace {

using internal::rethrow_first;
using internal::run_ranks;

constexpr std::chrono::seconds kTimeout{10};

std::vector<int> group_of(const std::vector<std::vector<int>>& groups, int rank) {
  for (const auto& group : groups) {
    for (int member : group) {
      if (member == rank) return group;
    }
  }
  return {};
}

TEST(GroupBootstrap, EveryCollectiveInsideEachGroup) {
  const std::vector<std::vector<int>> groups = {{3, 1}, {0, 2}};
  auto parent = ThreadBootstrap::create_group(4, kTimeout);
  rethrow_first(run_ranks(4, [&](int rank) {
    GroupBootstrap group(*parent[rank], group_of(groups, rank));
    EXPECT_EQ(group.world_size(), 2);
    EXPECT_EQ(group.rank(), rank == 3 || rank == 0 ? 0 : 1);
    internal::exercise_bootstrap(group);
  }));
}

TEST(GroupBootstrap, GroupsOfDifferentSizesMoveDifferentByteCounts) {
  const std::vector<std::vector<int>> groups = {{0, 1, 2}, {3}};
  auto parent = ThreadBootstrap::create_group(4, kTimeout);
  rethrow_first(run_ranks(4, [&](int rank) {
    GroupBootstrap group(*parent[rank], group_of(groups, rank));
    const int n = group.world_size();
    std::vector<int> mine(n, rank), all(n * n, -1);  // n ints per rank: 3 in one group, 1 in the other
    group.allgather(mine.data(), all.data(), n * sizeof(int));
    for (int i = 0; i < n * n; ++i) EXPECT_EQ(all[i], group_of(groups, rank)[i / n]);
    std::vector<char> text(n, rank == group_of(groups, rank)[0] ? 'r' : '?');
    group.broadcast(text.data(), text.size(), 0);
    EXPECT_EQ(std::string(text.begin(), text.end()), std::string(n, 'r'));
    group.barrier();
  }));
}

TEST(GroupBootstrap, RejectsBadGroupsAndMismatchedSizes) {
  auto parent = ThreadBootstrap::create_group(2, kTimeout);
  EXPECT_THROW(GroupBootstrap(*parent[0], {1}), std::invalid_argument);
  EXPECT_THROW(GroupBootstrap(*parent[0], {0, 0}), std::invalid_argument);
  EXPECT_THROW(GroupBootstrap(*parent[0], {0, 2}), std::invalid_argument);
  const auto errors = run_ranks(2, [&](int rank) {
    GroupBootstrap group(*parent[rank], {0, 1});
    std::vector<char> data(rank + 1), out(2 * (rank + 1));
    group.allgather(data.data(), out.data(), data.size());
  });
  for (const auto& error : errors) EXPECT_THROW(std::rethrow_exception(error), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::comm

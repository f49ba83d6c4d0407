// The groups gtp-bench runs its collective on: the world, or one group family of the GTP grid built
// from a profile's parallel sizes (topology::make_gtp_grid). Grid ranks are the launcher's ranks.
#pragma once

#include <string>
#include <vector>

#include "bench/collectives/collective_bench.h"

namespace gtp::bench {

struct BenchGroups {
  std::string name;                     // "world" or options.group
  std::vector<std::vector<int>> groups; // every group of the family, as job ranks
  int group_size = 1;

  const std::vector<int>& group_of(int rank) const;
};

// options.group is "world", a family name of topology::standard_groups() (tp, gtp_remat, tp_gtp_remat,
// dp, ...), or comma-separated dims of one grid view ("tp,gtp_remat", "expt_tp,ep"). Loads
// options.profile_path; throws std::invalid_argument naming --profile when its world size is not
// `world_size`, and naming --group for an unknown group.
BenchGroups resolve_groups(const BenchOptions& options, int world_size);

}  // namespace gtp::bench

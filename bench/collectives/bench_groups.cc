#include "bench/collectives/bench_groups.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "topology/arithmetic.h"
#include "topology/planner.h"
#include "topology/profile.h"

namespace gtp::bench {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The family's dims and view: a standard family name, or dims that all belong to one view.
topology::GroupSpec group_spec(const std::string& group, const topology::HyperCommGrid& grid) {
  for (const topology::GroupSpec& spec : topology::standard_groups()) {
    if (spec.name == group) return spec;
  }
  std::vector<std::string> dims;
  std::stringstream list(group);
  for (std::string dim; std::getline(list, dim, ',');) dims.push_back(dim);
  for (const std::string view : {"", topology::kExpertView}) {
    const std::vector<std::string>& names = grid.layout(view).dim_names;
    const bool all_in_view = !dims.empty() && std::all_of(dims.begin(), dims.end(), [&](const std::string& dim) {
      return contains(names, dim);
    });
    if (all_in_view) return topology::GroupSpec{group, view, dims};
  }
  throw std::invalid_argument("--group " + group + ": not a group family nor dims of one grid view: pass one of " +
                              joined(topology::standard_group_names()) + ", or comma-separated dims of " +
                              joined(grid.layout().dim_names) + " or of " +
                              joined(grid.layout(topology::kExpertView).dim_names));
}

}  // namespace

const std::vector<int>& BenchGroups::group_of(int rank) const {
  for (const std::vector<int>& group : groups) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  }
  throw std::invalid_argument("rank " + std::to_string(rank) + " is in no " + name + " group");
}

BenchGroups resolve_groups(const BenchOptions& options, int world_size) {
  BenchGroups result;
  result.name = options.group;
  if (options.profile_path.empty()) {
    result.groups.emplace_back(world_size);
    std::iota(result.groups[0].begin(), result.groups[0].end(), 0);
    result.group_size = world_size;
    return result;
  }
  const topology::Profile profile = topology::load_profile(options.profile_path);
  if (profile.sizes.world_size != world_size) {
    throw std::invalid_argument("--profile " + options.profile_path + ": parallel.world_size is " +
                                std::to_string(profile.sizes.world_size) + " but gtp-bench runs " +
                                std::to_string(world_size) + " ranks: launch " +
                                std::to_string(profile.sizes.world_size) +
                                " ranks (gtp-launch -n) or set parallel.world_size to " + std::to_string(world_size));
  }
  const topology::HyperCommGrid grid = topology::make_gtp_grid(profile.sizes);
  if (options.group == "world") {
    result.groups.emplace_back(world_size);
    std::iota(result.groups[0].begin(), result.groups[0].end(), 0);
  } else {
    const topology::GroupSpec spec = group_spec(options.group, grid);
    result.groups = grid.rank_enum(spec.dims, spec.view).to_lists();
  }
  result.group_size = static_cast<int>(result.groups[0].size());
  return result;
}

}  // namespace gtp::bench

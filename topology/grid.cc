#include "topology/grid.h"

#include <algorithm>
#include <limits>
#include <set>
#include <stdexcept>

namespace gtp::topology {
namespace {

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

std::string view_label(const std::string& view) { return view.empty() ? "base layout" : "view '" + view + "'"; }

void validate_layout(const GridLayout& layout, const std::string& what) {
  if (layout.shape.empty()) throw std::invalid_argument(what + ": shape is empty: give at least one dim");
  if (layout.shape.size() != layout.dim_names.size()) {
    throw std::invalid_argument(what + ": shape has " + std::to_string(layout.shape.size()) + " sizes but dim_names has " +
                                std::to_string(layout.dim_names.size()) + " names: give one name per size");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < layout.shape.size(); ++i) {
    const std::string& name = layout.dim_names[i];
    if (name.empty() || name.find('-') != std::string::npos) {
      throw std::invalid_argument(what + ": dim name '" + name +
                                  "' is invalid: names must be non-empty and must not contain '-' (the key separator)");
    }
    if (!seen.insert(name).second) {
      throw std::invalid_argument(what + ": dim name '" + name + "' appears twice: give each dim a unique name");
    }
    if (layout.shape[i] < 1) {
      throw std::invalid_argument(what + ": dim '" + name + "' has size " + std::to_string(layout.shape[i]) +
                                  ": sizes must be >= 1");
    }
  }
}

int checked_product(const std::vector<int>& shape, const std::string& what) {
  long long product = 1;
  for (int size : shape) {
    product *= size;
    if (product > std::numeric_limits<int>::max()) {
      throw std::invalid_argument(what + ": the grid has more than 2^31-1 ranks: use smaller sizes");
    }
  }
  return static_cast<int>(product);
}

}  // namespace

std::vector<int> RankGroups::group(int index) const {
  if (index < 0 || index >= num_groups()) {
    throw std::invalid_argument("group index " + std::to_string(index) + " is out of range [0, " +
                                std::to_string(num_groups()) + ")");
  }
  auto first = ranks.begin() + static_cast<long>(index) * group_size;
  return std::vector<int>(first, first + group_size);
}

std::vector<std::vector<int>> RankGroups::to_lists() const {
  std::vector<std::vector<int>> lists;
  lists.reserve(num_groups());
  for (int i = 0; i < num_groups(); ++i) lists.push_back(group(i));
  return lists;
}

HyperCommGrid::HyperCommGrid(std::vector<int> shape, std::vector<std::string> dim_names, int rank_offset,
                             int world_size) {
  GridLayout base{std::move(shape), std::move(dim_names)};
  validate_layout(base, "HyperCommGrid");
  size_ = checked_product(base.shape, "HyperCommGrid");
  if (rank_offset < 0) {
    throw std::invalid_argument("rank_offset=" + std::to_string(rank_offset) + " is negative: use 0 or more");
  }
  rank_offset_ = rank_offset;
  world_size_ = world_size < 0 ? rank_offset + size_ : world_size;
  if (static_cast<long long>(size_) > static_cast<long long>(world_size_) - rank_offset_) {
    throw std::invalid_argument("grid size " + std::to_string(size_) + " does not fit in world_size=" +
                                std::to_string(world_size_) + " minus rank_offset=" + std::to_string(rank_offset_) +
                                ": shrink the grid or lower rank_offset");
  }
  views_.emplace("", std::move(base));
}

void HyperCommGrid::add_view(const std::string& name, std::vector<int> shape, std::vector<std::string> dim_names,
                             const std::vector<std::string>& shared_dims) {
  if (name.empty()) throw std::invalid_argument("view name is empty: name the view (e.g. \"expert\")");
  if (views_.count(name)) throw std::invalid_argument("view '" + name + "' already exists: choose another name");
  GridLayout layout{std::move(shape), std::move(dim_names)};
  validate_layout(layout, "view '" + name + "'");
  const int view_size = checked_product(layout.shape, "view '" + name + "'");
  if (view_size != size_) {
    throw std::invalid_argument("view '" + name + "' spans " + std::to_string(view_size) +
                                " ranks but the grid spans " + std::to_string(size_) +
                                ": a view must factorize the same rank span");
  }
  views_.emplace(name, layout);
  try {
    for (const std::string& dim : shared_dims) {
      const GridLayout& base = views_.at("");
      if (std::find(base.dim_names.begin(), base.dim_names.end(), dim) == base.dim_names.end()) {
        throw std::invalid_argument("shared dim '" + dim + "' of view '" + name +
                                    "' is not a dim of the base layout: share only dims both layouts have");
      }
      if (rank_enum({dim}, "").ranks != rank_enum({dim}, name).ranks) {
        throw std::invalid_argument("shared dim '" + dim + "' enumerates different groups in view '" + name +
                                    "' than in the base layout: give it the same size and the same product of "
                                    "faster dims in both");
      }
    }
  } catch (...) {
    views_.erase(name);
    throw;
  }
}

const GridLayout& HyperCommGrid::checked_layout(const std::string& view) const {
  auto it = views_.find(view);
  if (it == views_.end()) {
    throw std::invalid_argument("unknown view '" + view + "': call add_view first (views: " +
                                join(view_names(), ", ") + ")");
  }
  return it->second;
}

const GridLayout& HyperCommGrid::layout(const std::string& view) const { return checked_layout(view); }

std::vector<std::string> HyperCommGrid::view_names() const {
  std::vector<std::string> names;
  for (const auto& entry : views_) names.push_back(entry.first);
  return names;
}

std::vector<int> HyperCommGrid::dim_indices(const GridLayout& layout, const std::vector<std::string>& dims,
                                            const std::string& view) const {
  if (dims.empty()) throw std::invalid_argument("no dims given: name at least one dim of the " + view_label(view));
  std::vector<int> indices;
  for (const std::string& dim : dims) {
    auto it = std::find(layout.dim_names.begin(), layout.dim_names.end(), dim);
    if (it == layout.dim_names.end()) {
      throw std::invalid_argument("dim '" + dim + "' is not in the " + view_label(view) + " (dims: " +
                                  join(layout.dim_names, ", ") + ")");
    }
    const int index = static_cast<int>(it - layout.dim_names.begin());
    if (std::find(indices.begin(), indices.end(), index) != indices.end()) {
      throw std::invalid_argument("dim '" + dim + "' is requested twice: list each dim once");
    }
    indices.push_back(index);
  }
  std::sort(indices.begin(), indices.end());  // dim_names order, whatever order the caller used
  return indices;
}

std::string HyperCommGrid::canonical_key(const std::vector<std::string>& dims, const std::string& view) const {
  const GridLayout& layout = checked_layout(view);
  std::vector<int> indices = dim_indices(layout, dims, view);
  std::vector<std::string> parts;
  for (auto it = indices.rbegin(); it != indices.rend(); ++it) parts.push_back(layout.dim_names[*it]);
  return join(parts, "-");
}

RankGroups HyperCommGrid::rank_enum(const std::vector<std::string>& dims, const std::string& view) const {
  const GridLayout& layout = checked_layout(view);
  const std::vector<int> in_group = dim_indices(layout, dims, view);
  const int ndims = static_cast<int>(layout.shape.size());
  std::vector<int> stride(ndims, 1);
  for (int i = 1; i < ndims; ++i) stride[i] = stride[i - 1] * layout.shape[i - 1];
  std::vector<int> across;  // dims that index the groups, fastest first
  for (int i = 0; i < ndims; ++i) {
    if (std::find(in_group.begin(), in_group.end(), i) == in_group.end()) across.push_back(i);
  }

  // Offsets of the members relative to their group's first rank, in group order.
  std::vector<int> member_offsets{0};
  for (int dim : in_group) {
    std::vector<int> next;
    next.reserve(member_offsets.size() * layout.shape[dim]);
    for (int step = 0; step < layout.shape[dim]; ++step) {
      for (int offset : member_offsets) next.push_back(offset + step * stride[dim]);
    }
    member_offsets.swap(next);
  }
  // First rank of every group, in group order.
  std::vector<int> group_bases{rank_offset_};
  for (int dim : across) {
    std::vector<int> next;
    next.reserve(group_bases.size() * layout.shape[dim]);
    for (int step = 0; step < layout.shape[dim]; ++step) {
      for (int base : group_bases) next.push_back(base + step * stride[dim]);
    }
    group_bases.swap(next);
  }

  RankGroups groups;
  groups.group_size = static_cast<int>(member_offsets.size());
  groups.ranks.reserve(static_cast<size_t>(size_));
  for (int base : group_bases) {
    for (int offset : member_offsets) groups.ranks.push_back(base + offset);
  }
  return groups;
}

const RankGroups& HyperCommGrid::create_group(const std::vector<std::string>& dims, const std::string& view) {
  const std::string key = canonical_key(dims, view);
  auto& store = created_[view];
  if (store.count(key)) {
    throw std::invalid_argument("group '" + key + "' of the " + view_label(view) +
                                " was already created: fetch it with group() instead of creating it again");
  }
  return store.emplace(key, rank_enum(dims, view)).first->second;
}

const RankGroups& HyperCommGrid::group(const std::vector<std::string>& dims, const std::string& view) const {
  const std::string key = canonical_key(dims, view);
  auto store = created_.find(view);
  if (store == created_.end() || !store->second.count(key)) {
    throw std::invalid_argument("group '" + key + "' of the " + view_label(view) +
                                " was never created: call create_group first");
  }
  return store->second.at(key);
}

bool HyperCommGrid::has_group(const std::vector<std::string>& dims, const std::string& view) const {
  const std::string key = canonical_key(dims, view);
  auto store = created_.find(view);
  return store != created_.end() && store->second.count(key) > 0;
}

std::vector<int> HyperCommGrid::coords(int rank, const std::string& view) const {
  const GridLayout& layout = checked_layout(view);
  if (rank < rank_offset_ || rank >= rank_offset_ + size_) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside the grid's span [" +
                                std::to_string(rank_offset_) + ", " + std::to_string(rank_offset_ + size_) + ")");
  }
  std::vector<int> out;
  int rest = rank - rank_offset_;
  for (int size : layout.shape) {
    out.push_back(rest % size);
    rest /= size;
  }
  return out;
}

std::vector<int> HyperCommGrid::group_of(int rank, const std::vector<std::string>& dims,
                                         const std::string& view) const {
  const GridLayout& layout = checked_layout(view);
  const std::vector<int> in_group = dim_indices(layout, dims, view);
  std::vector<int> coord = coords(rank, view);
  for (int dim : in_group) coord[dim] = 0;
  int base = rank_offset_, stride = 1;
  std::vector<int> strides;
  for (size_t i = 0; i < layout.shape.size(); ++i) {
    base += coord[i] * stride;
    strides.push_back(stride);
    stride *= layout.shape[i];
  }
  std::vector<int> members{base};
  for (int dim : in_group) {
    std::vector<int> next;
    for (int step = 0; step < layout.shape[dim]; ++step) {
      for (int member : members) next.push_back(member + step * strides[dim]);
    }
    members.swap(next);
  }
  return members;
}

GridLayout to_last_dim_fastest(const GridLayout& first_dim_fastest) {
  validate_layout(first_dim_fastest, "mesh conversion");
  return GridLayout{{first_dim_fastest.shape.rbegin(), first_dim_fastest.shape.rend()},
                    {first_dim_fastest.dim_names.rbegin(), first_dim_fastest.dim_names.rend()}};
}

GridLayout from_last_dim_fastest(const GridLayout& last_dim_fastest) {
  // Reversal is its own inverse; the separate name documents the direction at call sites.
  return to_last_dim_fastest(last_dim_fastest);
}

}  // namespace gtp::topology

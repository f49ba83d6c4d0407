// HyperCommGrid: named parallel dims over a contiguous rank span, with Megatron-Core's semantics.
//
// Convention (Megatron's, not PyTorch's): the FIRST name in dim_names varies fastest (stride 1).
// shape [2,3,4,5] over tp,cp,pp,dp means rank = offset + tp + 2*cp + 6*pp + 24*dp.
// A group over a subset of dims holds the ranks that differ only in those dims; inside a group
// the first requested dim (in dim_names order) varies fastest, and groups are listed with the
// remaining dims fastest-first. Use to_last_dim_fastest() to talk to PyTorch DeviceMesh / JAX.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gtp::topology {

// Every group of one enumeration, stored flat: group i is ranks[i*group_size, (i+1)*group_size).
struct RankGroups {
  int group_size = 0;
  std::vector<int> ranks;

  int num_groups() const { return group_size == 0 ? 0 : static_cast<int>(ranks.size()) / group_size; }
  std::vector<int> group(int index) const;
  std::vector<std::vector<int>> to_lists() const;
};

// One factorization of the rank span: sizes and names, first name fastest.
struct GridLayout {
  std::vector<int> shape;
  std::vector<std::string> dim_names;
};

class HyperCommGrid {
 public:
  // world_size < 0 means "exactly the grid": rank_offset + product(shape).
  HyperCommGrid(std::vector<int> shape, std::vector<std::string> dim_names, int rank_offset = 0,
                int world_size = -1);

  // A second factorization of the same rank span (e.g. the expert grid). shared_dims must exist
  // in both layouts and enumerate identically; they are validated here.
  void add_view(const std::string& name, std::vector<int> shape, std::vector<std::string> dim_names,
                const std::vector<std::string>& shared_dims);

  // Canonical store key: the dims joined by "-" in REVERSED dim_names order.
  std::string canonical_key(const std::vector<std::string>& dims, const std::string& view = "") const;

  // The full enumeration of groups spanning dims, without creating anything.
  RankGroups rank_enum(const std::vector<std::string>& dims, const std::string& view = "") const;

  // Records the enumeration under its canonical key; re-creating a key is an error, because a
  // second creation could carry different communicator options that cannot be compared.
  const RankGroups& create_group(const std::vector<std::string>& dims, const std::string& view = "");
  const RankGroups& group(const std::vector<std::string>& dims, const std::string& view = "") const;
  bool has_group(const std::vector<std::string>& dims, const std::string& view = "") const;

  // The group over dims that contains rank (a global rank inside the span).
  std::vector<int> group_of(int rank, const std::vector<std::string>& dims,
                            const std::string& view = "") const;
  // Coordinate of rank along every dim of the view, in dim_names order.
  std::vector<int> coords(int rank, const std::string& view = "") const;

  const GridLayout& layout(const std::string& view = "") const;
  std::vector<std::string> view_names() const;
  int size() const { return size_; }
  int rank_offset() const { return rank_offset_; }
  int world_size() const { return world_size_; }

 private:
  const GridLayout& checked_layout(const std::string& view) const;
  std::vector<int> dim_indices(const GridLayout& layout, const std::vector<std::string>& dims,
                               const std::string& view) const;

  int size_ = 0;
  int rank_offset_ = 0;
  int world_size_ = 0;
  std::map<std::string, GridLayout> views_;  // "" is the base layout
  std::map<std::string, std::map<std::string, RankGroups>> created_;  // view -> key -> groups
};

// PyTorch DeviceMesh and JAX meshes make the LAST dim fastest; the same rank layout is the
// reversed shape and names.
GridLayout to_last_dim_fastest(const GridLayout& first_dim_fastest);
GridLayout from_last_dim_fastest(const GridLayout& last_dim_fastest);

}  // namespace gtp::topology

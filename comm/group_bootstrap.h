// A Bootstrap over a subgroup of a parent bootstrap's ranks, so that a HostComm (or anything else that
// needs a Bootstrap) can run on one grid group. Every call is carried by the PARENT: all ranks of the
// parent make the same calls in the same order, each inside its own group (the groups of one family
// run in lockstep, as they do when every group runs the same collective at once). Groups may differ in
// buffer sizes: each call is one variable-size allgather of the parent.
#pragma once

#include <vector>

#include "comm/bootstrap.h"

namespace gtp::comm {

class GroupBootstrap : public Bootstrap {
 public:
  // `members` lists parent ranks in group order and must contain parent.rank(); std::invalid_argument
  // otherwise or for a rank out of range or listed twice. `parent` must outlive this object.
  GroupBootstrap(Bootstrap& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(members_.size()); }
  // Members must agree on bytes_per_rank (std::invalid_argument naming both otherwise).
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override;
  void broadcast(void* buffer, std::size_t bytes, int root) override;
  void barrier() override;

 private:
  Bootstrap& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace gtp::comm

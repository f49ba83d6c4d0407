#include "comm/group_bootstrap.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace gtp::comm {

GroupBootstrap::GroupBootstrap(Bootstrap& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  std::vector<char> seen(parent.world_size(), 0);
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const int member = members_[i];
    if (member < 0 || member >= parent.world_size() || seen[member]) {
      const bool in_range = member >= 0 && member < parent.world_size();
      throw std::invalid_argument("group member " + std::to_string(member) +
                                  (in_range ? " is listed twice" : " is not a rank of the parent") +
                                  ": list each parent rank in [0, " + std::to_string(parent.world_size()) +
                                  ") at most once");
    }
    seen[member] = 1;
    if (member == parent.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) {
    throw std::invalid_argument("parent rank " + std::to_string(parent.rank()) +
                                " is not a member of its group: pass the group that contains it");
  }
}

void GroupBootstrap::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  const std::string mine(static_cast<const char*>(send), send != nullptr ? bytes_per_rank : 0);
  const std::vector<std::string> all = parent_.allgather_records(mine);
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const std::string& theirs = all[members_[i]];
    if (theirs.size() != bytes_per_rank) {
      throw std::invalid_argument("group allgather: rank " + std::to_string(rank_) + " passes " +
                                  std::to_string(bytes_per_rank) + " bytes but rank " + std::to_string(i) + " passes " +
                                  std::to_string(theirs.size()) + ": pass the same size on every rank of the group");
    }
    if (bytes_per_rank > 0) std::memcpy(static_cast<char*>(recv) + i * bytes_per_rank, theirs.data(), bytes_per_rank);
  }
}

void GroupBootstrap::broadcast(void* buffer, std::size_t bytes, int root) {
  check_root(root);
  const std::string mine = rank_ == root ? std::string(static_cast<const char*>(buffer), bytes) : std::string();
  const std::vector<std::string> all = parent_.allgather_records(mine);
  const std::string& sent = all[members_[root]];
  if (sent.size() != bytes) {
    throw std::invalid_argument("group broadcast: root " + std::to_string(root) + " sends " + std::to_string(sent.size()) +
                                " bytes but rank " + std::to_string(rank_) + " expects " + std::to_string(bytes) +
                                ": pass the same size on every rank of the group");
  }
  if (rank_ != root && bytes > 0) std::memcpy(buffer, sent.data(), bytes);
}

void GroupBootstrap::barrier() { parent_.barrier(); }

}  // namespace gtp::comm

// A Bootstrap among threads of one process, for tests: create_group() returns one object per rank,
// each to be used by its own thread. Destroying a rank's object while others wait in a collective makes
// them fail (as if that rank had died), so failure paths are testable without processes.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/bootstrap.h"

namespace gtp::comm {

class ThreadBootstrap : public Bootstrap {
 public:
  static std::vector<std::unique_ptr<ThreadBootstrap>> create_group(int world_size, std::chrono::milliseconds timeout);
  ~ThreadBootstrap() override;

  int rank() const override { return rank_; }
  int world_size() const override;
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override;
  void broadcast(void* buffer, std::size_t bytes, int root) override;
  void barrier() override;

  struct Shared;  // the rendezvous state all ranks of a group share

 private:
  ThreadBootstrap(std::shared_ptr<Shared> shared, int rank);

  std::shared_ptr<Shared> shared_;
  int rank_;
  std::uint64_t sequence_ = 0;  // collectives this rank has started
};

}  // namespace gtp::comm

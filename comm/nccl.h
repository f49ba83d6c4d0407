// NCCL communicators for the grid's groups: one world communicator whose unique id travels over a
// Bootstrap, then one ncclCommSplit per kind of grid group (color = group index, key = position in
// the group). Every init is non-blocking (ncclConfig_t.blocking = 0) and polled against a timeout;
// a communicator that fails or times out is aborted (ncclCommAbort), never left hanging.
// A framework may instead lend a communicator it owns (NcclComm::borrow); libgtp never destroys it.
//
// Collective calls (create_world, split) must be made by every rank of the parent, in the same order.
// None of them is CUDA-graph-capture safe: create communicators before capturing (docs/comm.md).
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"

namespace gtp::comm {

// The ncclConfig_t fields a profile may set per group. -1 / empty keeps NCCL's default.
struct NcclGroupConfig {
  int cga_cluster_size = -1;
  int min_ctas = -1;
  int max_ctas = -1;
  std::string net_name;
  std::string comm_name;  // shows up in NCCL's logs and profilers, e.g. "gtp_remat"
};

// Where a rank lands in ncclCommSplit for `groups` (lists of parent ranks): color = index of the group
// containing `rank`, key = its position there; color NCCL_SPLIT_NOCOLOR when no group contains it.
// Throws std::invalid_argument for a rank outside [0, parent_size), a rank listed twice, or an empty group.
struct SplitAssignment {
  int color;
  int key;
};
SplitAssignment split_assignment(const std::vector<std::vector<int>>& groups, int rank, int parent_size);

class NcclComm {
 public:
  NcclComm() = default;  // no communicator (a rank outside every group of a split)
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Owned communicators are finalized and destroyed (aborted if that fails or takes too long).
  ~NcclComm();

  // One communicator over all ranks of `bootstrap`, on the calling thread's current CUDA device.
  static NcclComm create_world(Bootstrap& bootstrap, std::chrono::milliseconds timeout,
                               const NcclGroupConfig& config = {});
  // Wraps a communicator the framework owns: usable like any other, never finalized or destroyed here.
  static NcclComm borrow(ncclComm_t comm);

  // Collective over this communicator: returns this rank's communicator in `groups` (see
  // split_assignment), or an empty NcclComm when no group contains it.
  NcclComm split(const std::vector<std::vector<int>>& groups, const NcclGroupConfig& config,
                 std::chrono::milliseconds timeout) const;

  bool valid() const { return comm_ != nullptr; }
  ncclComm_t get() const { return comm_; }
  bool owned() const { return owned_; }
  int rank() const;
  int size() const;

  // Polls NCCL's asynchronous error state; on an error, aborts an owned communicator and throws
  // CommError with NCCL's last error text. Cheap enough to call after every step.
  void check_async_error();
  // A non-blocking communicator may return ncclInProgress from a collective while it is still being
  // enqueued: waits until it is, or aborts and throws (CommError, timed out) after `timeout`.
  void wait_enqueued(std::chrono::milliseconds timeout);
  // Aborts an owned communicator now (pending NCCL work is cancelled); a borrowed one is only released.
  void abort();

 private:
  NcclComm(ncclComm_t comm, bool owned, std::unique_ptr<std::string> name = nullptr)
      : comm_(comm), owned_(owned), name_(std::move(name)) {}
  void release();

  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  // The commName NCCL was given: it may keep the pointer, so the text lives as long as the
  // communicator (on the heap, so that moving this object does not move it).
  std::unique_ptr<std::string> name_;
};

}  // namespace gtp::comm

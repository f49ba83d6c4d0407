// Host-memory collectives between processes over UCX, so the runtime can run multi-rank on machines
// without GPUs. Every rank connects to every other rank (worker addresses are exchanged over a
// Bootstrap); collectives are rings, correct for any number of ranks. See docs/comm.md.
//
// Contract: all ranks call the same collectives in the same order with the same counts and types.
// A call completes, or throws within the timeout on every rank: std::invalid_argument when ranks
// disagree (the message names both sides), CommError when a peer died or stalled. After an error the
// communicator is unusable; create a new one. Destruction is collective too: each rank waits (at most
// the timeout) for its peers' goodbyes, so none leaves while its last messages are in flight. One thread
// at a time per object.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/bootstrap.h"

namespace gtp::comm {

enum class HostDataType { kFloat32, kBFloat16 };  // BF16 is stored as its 16-bit pattern
enum class HostReduceOp { kSum, kMean };          // both accumulate in FP32; mean divides by the rank count

namespace internal {
class UcxWorker;
class UcxPeers;
}  // namespace internal

class HostComm {
 public:
  // Collective over `bootstrap` (used only during construction). `label` names the communicator in
  // every error (say the grid group, "host comm gtp_remat").
  HostComm(Bootstrap& bootstrap, std::chrono::milliseconds timeout, const std::string& label = "host comm");
  ~HostComm();
  HostComm(const HostComm&) = delete;
  HostComm& operator=(const HostComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // recv[r * bytes_per_rank ...] = rank r's send. `send` may alias this rank's slot of `recv`.
  void all_gather(const void* send, void* recv, std::size_t bytes_per_rank);

  // `send` holds size() * recv_count elements of `type`; recv (recv_count elements of `type`) gets the
  // sum (or mean) over ranks of the recv_count elements at offset rank() * recv_count. Partial sums
  // travel in FP32 whatever the input type; BF16 results are rounded to nearest even once, at the end.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, HostDataType type, HostReduceOp op);

  // In place: data[i] = max over ranks of data[i]. A NaN on any rank makes the result NaN.
  void all_reduce_max(float* data, std::size_t count);

  void barrier();

  // The timeout of each later collective (the constructor's bounds only the connection).
  void set_timeout(std::chrono::milliseconds timeout);
  // Marks the communicator failed and tells every peer to throw `reason` (CommError) from the
  // collective it waits in, or its next one: a rank whose call failed between collectives calls it so
  // that no peer waits for a collective this rank will not make. Never throws.
  void abort(const std::string& reason) noexcept;

 private:
  std::uint64_t next_sequence();  // the tag sequence of the next collective's first step

  int rank_;
  int size_;
  std::uint64_t collectives_ = 0;
  std::unique_ptr<internal::UcxWorker> worker_;
  std::unique_ptr<internal::UcxPeers> peers_;
};

}  // namespace gtp::comm

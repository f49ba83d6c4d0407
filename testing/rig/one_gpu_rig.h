// OneGpuRig: a TEST DOUBLE for NCCL. It runs G ranks as threads of one process on ONE GPU, so that the
// CUDA backend's multi-rank paths (reduce-scatters, padding-only ranks, the pooled grads, fill graphs
// and captures with real peers) run, under compute-sanitizer too, on a machine with a single GPU.
// NCCL stays the only production transport: nothing outside testing/rig/ builds one (docs/rig.md).
//
// Each rank owns a CudaBackend (its own streams, events and device buffers) built with
// `transport(rank)`. A collective is enqueued on the calling rank's stream only, as NCCL's:
//   1. the rank publishes its send pointer and raises one arrival flag per peer;
//   2. it waits for every peer's arrival flag to it, and lowers them (a flag belongs to its receiver);
//   3. a kernel moves the data: all-gather and reduce-scatter pull from the peers' send buffers into
//      this rank's recv buffer; the amax all-reduce has each rank reduce the elements it owns
//      (i % G == rank) and write the result to every peer's buffer;
//   4. a second round of flags (departure): no rank returns while a peer still reads its send buffer
//      or, for the all-reduce, writes its buffer.
// Flags hold only 0 and 1 and every receiver resets its own, so nothing depends on a host-side
// sequence number: a CUDA graph that captured a collective replays it correctly any number of times,
// interleaved with eager ones. The host never waits for a peer; a rank thread may run ahead of the
// others by any number of collectives (its stream waits, as NCCL's kernels would).
//
// Flags::kHostRendezvous needs no device flags: each round, a rank records a CUDA event and hands it to
// its peers on the host, waits (at most `spin_timeout`, then throws naming the missing ranks) until
// every peer has handed over its own for the same collective, and makes its stream wait on them. No
// kernel spins and every wait is on work already submitted, so it runs under compute-sanitizer, which
// runs kernels one at a time (the modes below then deadlock); the host exchange is what NCCL would not
// do, and a collective in it cannot be captured into a CUDA graph (refused: std::logic_error).
// Otherwise flags are raised and awaited by one-thread kernels that spin at most `spin_timeout` and then trap
// (a sticky CUDA error, so the test fails instead of hanging; which wait timed out is in
// `timeout_report()`), or, with Flags::kStreamMemOps, by CUDA stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32: the stream's front end waits, no kernel spins, nothing
// bounds the wait).
//
// Ranks sharing one device deadlock where separate GPUs would not, whenever something waits for the
// whole device (or a hardware queue) while a peer's stream waits for this rank. Before CUDA starts,
// this library sets CUDA_MODULE_LOADING=EAGER (a lazily loaded kernel's first launch may synchronize
// the context) and CUDA_DEVICE_MAX_CONNECTIONS=32 unless set (streams sharing a hardware queue run in
// submission order: enough queues for G <= 8 ranks of three streams); a rank's backend allocates
// through its transport from an arena the rig allocated up front, never with cudaMalloc / cudaFree,
// which may wait for the device. Tests must not synchronize the device either (they allocate from
// the transport too; rig_ranks.h has a watchdog that prints `progress_report()`).
//
// Rules (as NCCL's): every rank of a communicator issues the same collectives in the same order with
// the same sizes; a rank issues one communicator's collectives on one stream (checked: a second
// stream throws std::logic_error).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/device_collectives.h"

namespace gtp::remat {

class OneGpuRig {
 public:
  enum class Flags { kAuto, kStreamMemOps, kKernels, kHostRendezvous };
  // `world` ranks on `device`. groups[g] partitions the ranks (0..world-1) into the communicators of
  // backend group g, each rank in exactly one part; empty: one group of all ranks. Every part gets
  // two communicators (gathers, reduce-scatters), as CudaGroup has. Throws std::invalid_argument for
  // a bad partition, std::runtime_error when CUDA fails or kStreamMemOps is asked for and missing.
  // Not thread-safe itself: build it, then hand transport(r) to each rank's thread.
  // kKernels (the default) bounds every wait by `spin_timeout`; kStreamMemOps cannot time out (the
  // watchdog of rig_ranks.h then reports); kAuto: stream memory operations where usable.
  // Each rank's device memory (its backend's, through DeviceCollectives::allocate, and its test's) is
  // a slice of `arena_bytes_per_rank` allocated here, before any rank runs.
  OneGpuRig(int device, int world, std::vector<std::vector<std::vector<int>>> groups = {},
            Flags flags = Flags::kKernels, std::chrono::milliseconds spin_timeout = std::chrono::seconds(30),
            std::int64_t arena_bytes_per_rank = std::int64_t{256} << 20);
  ~OneGpuRig();
  OneGpuRig(const OneGpuRig&) = delete;
  OneGpuRig& operator=(const OneGpuRig&) = delete;

  int world() const { return world_; }
  // What flags are raised with ("stream memory operations" or "kernels") and the hardware queues.
  std::string flags() const;
  // Rank r's transport, for CudaBackend(device, transport(r)). Once per rank; the rig must outlive it.
  std::unique_ptr<DeviceCollectives> transport(int rank);
  // Non-empty once a kernel flag wait timed out: which rank waited for which peer, on which
  // communicator. Read without synchronizing (mapped host memory).
  std::string timeout_report() const;
  // Per rank and communicator used: collectives issued by its thread, and the last one its stream
  // has completed (from mapped host memory, without synchronizing; replays of a captured collective
  // report the number it had at capture), and with kernel flags how many its stream executed, replays
  // included. What the watchdog prints when a rank hangs, and on_rig_ranks when a rank fails. With
  // GTP_RIG_TRACE set in the environment, every collective a rank issues is printed to stderr.
  std::string progress_report() const;

  // A host barrier of every world rank, bounded by `spin_timeout` (then std::runtime_error naming the
  // ranks that did not arrive). cudaGraphInstantiate may wait for the device while holding a lock that
  // every CUDA call of the context takes; with ranks sharing one context, a peer's device work waiting
  // for a rank blocked on that lock would never end. So every rank passes this barrier right before
  // and right after it instantiates a graph (the rig's transport does so for CudaBackend's fill
  // graphs; a test instantiating its own capture calls it): before, every rank has issued all it will
  // until then, so the device work in flight needs nothing more; after, no rank launches a graph whose
  // collectives would wait for a peer still instantiating. Recordings are rank-uniform, so every rank
  // reaches the same barriers. NCCL has no such barrier: it exists because the ranks share a context.
  void graph_barrier(int rank);

  // One communicator: ranks (world ranks, in group-rank order) and its device state.
  struct Comm {
    int group = 0, part = 0;
    bool reduce_scatter = false;
    std::vector<int> ranks;
    std::uint32_t* flags = nullptr;  // [2 rounds][receiver][sender], device memory
    const void** ptrs = nullptr;     // [sender]: the send (all-reduce: data) pointer, device memory
  };
  // Internals shared with the transports (one_gpu_rig.cc).
  struct State;

 private:
  int world_;
  std::unique_ptr<State> state_;
};

}  // namespace gtp::remat

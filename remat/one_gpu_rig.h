// OneGpuRig: a TEST DOUBLE for NCCL. It runs G ranks as threads of one process on ONE GPU, so that the
// CUDA backend's multi-rank paths (reduce-scatters, padding-only ranks, the pooled grads, fill graphs
// and captures with real peers) run, under compute-sanitizer too, on a machine with a single GPU.
// NCCL stays the only production transport: nothing outside tests and the overlap benchmark's rig
// mode builds one (docs/remat.md, "One-GPU rig").
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
// Flags are raised and awaited by CUDA stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32: the stream's front end waits, no kernel spins, so no kernel can stand in the
// way of a peer's) where the device supports them, else by one-thread kernels that spin at most
// `spin_timeout` and then trap (a sticky CUDA error, so the test fails instead of hanging; which wait
// timed out is in `timeout_report()`). Kernel flags need every rank's flag kernel resident at once,
// which holds for G <= 8 on any GPU this project targets.
//
// All ranks' streams live on one device, whose hardware queues (CUDA_DEVICE_MAX_CONNECTIONS) they
// share: two streams in one queue run in submission order, so a rank waiting for a peer could hold
// back that peer's work behind it. The library sets CUDA_DEVICE_MAX_CONNECTIONS=32 (unless set)
// before CUDA starts, enough for G <= 8 ranks of three streams each; `flags()` reports the setting.
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
  enum class Flags { kAuto, kStreamMemOps, kKernels };
  // `world` ranks on `device`. groups[g] partitions the ranks (0..world-1) into the communicators of
  // backend group g, each rank in exactly one part; empty: one group of all ranks. Every part gets
  // two communicators (gathers, reduce-scatters), as CudaGroup has. Throws std::invalid_argument for
  // a bad partition, std::runtime_error when CUDA fails or kStreamMemOps is asked for and missing.
  // Not thread-safe itself: build it, then hand transport(r) to each rank's thread.
  OneGpuRig(int device, int world, std::vector<std::vector<std::vector<int>>> groups = {},
            Flags flags = Flags::kAuto, std::chrono::milliseconds spin_timeout = std::chrono::seconds(60));
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

// DeviceCollectives: the three collectives a CudaBackend enqueues, when they do not go to NCCL.
// NCCL (CudaGroup's communicators) is the only production transport; this interface exists so that a
// test transport (OneGpuRig, testing/rig/one_gpu_rig.h: G ranks as threads on one GPU) can stand in for it
// and run every multi-rank device path on one GPU. Same contract as the Backend calls of the same
// names (remat/backend.h), per group: each call is enqueued on `stream` and completes there, ordered
// as NCCL orders a communicator's collectives (one after another, in issue order, on every rank); the
// host never waits for a peer. Gathers and amax all-reduces of a group share one communicator,
// reduce-scatters have their own (CudaGroup). Batches (Backend::CollectiveBatch) need nothing from a
// transport: the backend records a batch's collectives and calls them here, in order, at its end (a
// cancelled batch calls none).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gtp::remat {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual int group_count() const = 0;
  // This rank's group size and rank in group `group` (0 <= group < group_count()).
  virtual int size(int group) const = 0;
  virtual int rank(int group) const = 0;
  virtual void all_gather(cudaStream_t stream, int group, const void* send, void* recv,
                          std::int64_t bytes_per_rank) = 0;
  virtual void all_reduce_max(cudaStream_t stream, int group, float* data, std::int64_t count) = 0;
  virtual void reduce_scatter_mean(cudaStream_t stream, int group, const float* send, float* recv,
                                   std::int64_t recv_count) = 0;
  // The backend's device memory (CudaBackend::do_allocate / do_deallocate go here). A transport whose
  // peers share this device must allocate and free without synchronizing the device: cudaMalloc /
  // cudaFree may wait for every stream on it, a peer's too, which may be waiting for this rank's next
  // collective. Throws std::runtime_error when the memory cannot be had.
  virtual void* allocate(std::int64_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;

  // Called by CudaBackend::end_graph right before it instantiates a recorded graph (`done` false) and
  // right after (`done` true). cudaGraphInstantiate may wait for the device while holding a lock every
  // CUDA call of the context takes, so where peers share this device's context a transport must keep
  // their device work from waiting on this rank meanwhile (the rig: a barrier of every rank on both
  // sides; recordings are rank-uniform). Throws std::runtime_error when a peer never arrives.
  virtual void around_graph_instantiate(bool done) { (void)done; }
};

}  // namespace gtp::remat

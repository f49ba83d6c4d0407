// The one-GPU rig's device code (one_gpu_rig.h): flag rounds by kernel, and the data movement
// of each collective. Every rank passes its communicator's pointer table (`ptrs`, one per group rank)
// and its own group rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gtp::remat::rig {

// Written by a kernel flag wait that timed out (mapped host memory), before it traps.
struct TimeoutReport {
  volatile int timed_out;
  volatile int comm, rank, peer, round;
};

// One flag round by a one-thread kernel: publishes `ptr` into ptrs[rank] when `publish`, raises
// flags[round][q][rank] for every peer q, waits for flags[round][rank][r] of every peer r (at most
// `timeout_ns`, then fills `report` and traps) and lowers them.
// Then, when `progress` is not null, writes `done` there, and when `executed` is not null, counts one
// more collective there (both mapped host memory, for the watchdog's report: `done` is the number the
// host gave the collective, which a CUDA graph replays as recorded; `executed` counts replays too).
void flag_round_kernel(cudaStream_t stream, std::uint32_t* flags, const void** ptrs, bool publish, const void* ptr,
                       int size, int rank, int round, long long timeout_ns, TimeoutReport* report, int comm,
                       std::uint32_t* progress, std::uint32_t done, std::uint32_t* executed);

// Flags::kHostRendezvous's device part of a round (one thread, no waiting): publishes `ptr` into
// `slot` when `slot` is not null, writes `done` to `progress` and counts one more in `executed` when
// those are not null.
void host_round_kernel(cudaStream_t stream, const void** slot, const void* ptr, std::uint32_t* progress,
                       std::uint32_t done, std::uint32_t* executed);

// dst[0 .. bytes) = src[0 .. bytes) by a kernel, either side device or page-locked host memory (UVA):
// the copy runs on the stream's compute queue, not a copy engine's (rig_ranks.h, PinnedStage with
// GTP_RIG_STAGE=kernel).
void copy_bytes(cudaStream_t stream, void* dst, const void* src, std::int64_t bytes);
// recv[r * bytes ...] = ptrs[r][0 .. bytes) for every r (skipped where it is recv's own segment).
void all_gather(cudaStream_t stream, const void* const* ptrs, int size, void* recv, std::int64_t bytes);
// recv[i] = (sum over r of ptrs[r][rank * count + i]) / size, summed from rank + 1 round to rank, the
// order of the host backend's ring (comm/host.cc), so both give the same bits.
void reduce_scatter_mean(cudaStream_t stream, const void* const* ptrs, int size, int rank, float* recv,
                         std::int64_t count);
// For each i with i % size == rank: the NaN-propagating max over r of ptrs[r][i], written to every r.
void all_reduce_max(cudaStream_t stream, const void* const* ptrs, int size, int rank, std::int64_t count);

}  // namespace gtp::remat::rig

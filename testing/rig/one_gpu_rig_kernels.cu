#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "testing/rig/one_gpu_rig_kernels.h"

namespace gtp::remat::rig {
namespace {

void launched(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string("one-GPU rig ") + what + ": " + cudaGetErrorString(error));
}

// A peer's pointer, published by a stream write or another kernel: read past the L1 cache.
__device__ const void* peer(const void* const* ptrs, int r) { return *reinterpret_cast<const void* const volatile*>(&ptrs[r]); }

__device__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void flag_round(std::uint32_t* flags, const void** ptrs, bool publish, const void* ptr, int size, int rank,
                           int round, long long timeout_ns, TimeoutReport* report, int comm, std::uint32_t* progress,
                           std::uint32_t done, std::uint32_t* executed) {
  volatile std::uint32_t* base = flags + static_cast<std::int64_t>(round) * size * size;
  if (publish) *reinterpret_cast<const void* volatile*>(&ptrs[rank]) = ptr;
  __threadfence();  // the pointer (and this rank's earlier writes) before the flags
  for (int q = 0; q < size; ++q) {
    if (q != rank) base[q * size + rank] = 1;
  }
  const long long start = now_ns();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    while (base[rank * size + r] != 1) {
      if (now_ns() - start > timeout_ns) {
        report->comm = comm;
        report->rank = rank;
        report->peer = r;
        report->round = round;
        __threadfence_system();
        report->timed_out = 1;
        __threadfence_system();
        __trap();
      }
      __nanosleep(200);
    }
    base[rank * size + r] = 0;
  }
  __threadfence();
  if (progress != nullptr) *reinterpret_cast<volatile std::uint32_t*>(progress) = done;
  if (executed != nullptr) {  // only this rank's kernels on one stream touch it: no atomic needed
    volatile std::uint32_t* count = executed;
    *count = *count + 1;
  }
}

__global__ void host_round(const void** slot, const void* ptr, std::uint32_t* progress, std::uint32_t done,
                           std::uint32_t* executed) {
  if (slot != nullptr) *reinterpret_cast<const void* volatile*>(slot) = ptr;
  __threadfence_system();
  if (progress != nullptr) *reinterpret_cast<volatile std::uint32_t*>(progress) = done;
  if (executed != nullptr) {
    volatile std::uint32_t* count = executed;
    *count = *count + 1;
  }
}

__global__ void gather(const void* const* ptrs, int size, unsigned char* recv, std::int64_t bytes) {
  bool aligned = reinterpret_cast<std::uintptr_t>(recv) % 16 == 0 && bytes % 16 == 0;
  for (int r = 0; r < size; ++r) aligned = aligned && reinterpret_cast<std::uintptr_t>(peer(ptrs, r)) % 16 == 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int r = 0; r < size; ++r) {
    const unsigned char* src = static_cast<const unsigned char*>(peer(ptrs, r));
    unsigned char* dst = recv + r * bytes;
    if (src == dst) continue;  // in place: this rank's own segment
    if (aligned) {
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint4* d = reinterpret_cast<uint4*>(dst);
      for (std::int64_t i = first; i < bytes / 16; i += stride) d[i] = s[i];
    } else {
      for (std::int64_t i = first; i < bytes; i += stride) dst[i] = src[i];
    }
  }
}

__global__ void reduce_scatter(const void* const* ptrs, int size, int rank, float* recv, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const std::int64_t at = rank * count + i;
    float sum = static_cast<const float*>(peer(ptrs, (rank + 1) % size))[at];
    for (int k = 2; k <= size; ++k) sum = __fadd_rn(sum, static_cast<const float*>(peer(ptrs, (rank + k) % size))[at]);
    recv[i] = __fdiv_rn(sum, static_cast<float>(size));
  }
}

__device__ float nan_max(float a, float b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a > b ? a : b;
}

__global__ void reduce_max(const void* const* ptrs, int size, int rank, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * size;
  for (std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * size + rank; i < count;
       i += stride) {
    float m = static_cast<const float*>(peer(ptrs, 0))[i];
    for (int r = 1; r < size; ++r) m = nan_max(m, static_cast<const float*>(peer(ptrs, r))[i]);
    for (int r = 0; r < size; ++r) static_cast<float*>(const_cast<void*>(peer(ptrs, r)))[i] = m;
  }
}

unsigned blocks_for(std::int64_t items) {
  constexpr std::int64_t kThreads = 256, kMaxBlocks = 2048;
  const std::int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

}  // namespace

void flag_round_kernel(cudaStream_t stream, std::uint32_t* flags, const void** ptrs, bool publish, const void* ptr,
                       int size, int rank, int round, long long timeout_ns, TimeoutReport* report, int comm,
                       std::uint32_t* progress, std::uint32_t done, std::uint32_t* executed) {
  flag_round<<<1, 1, 0, stream>>>(flags, ptrs, publish, ptr, size, rank, round, timeout_ns, report, comm, progress,
                                  done, executed);
  launched("flag kernel");
}

void host_round_kernel(cudaStream_t stream, const void** slot, const void* ptr, std::uint32_t* progress,
                       std::uint32_t done, std::uint32_t* executed) {
  host_round<<<1, 1, 0, stream>>>(slot, ptr, progress, done, executed);
  launched("host-round kernel");
}

__global__ void copy_bytes_kernel(unsigned char* dst, const unsigned char* src, std::int64_t bytes) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const bool vectors = ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) == 0;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectors) {
    const std::int64_t n = bytes / 16;
    for (std::int64_t v = i; v < n; v += stride) reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    tail = n * 16;
  }
  for (std::int64_t b = tail + i; b < bytes; b += stride) dst[b] = src[b];
}

void copy_bytes(cudaStream_t stream, void* dst, const void* src, std::int64_t bytes) {
  if (bytes <= 0) return;
  copy_bytes_kernel<<<blocks_for(bytes / 16 + 1), 256, 0, stream>>>(static_cast<unsigned char*>(dst),
                                                                    static_cast<const unsigned char*>(src), bytes);
  launched("copy kernel");
}

void all_gather(cudaStream_t stream, const void* const* ptrs, int size, void* recv, std::int64_t bytes) {
  if (bytes <= 0) return;
  gather<<<blocks_for(size * bytes / 16 + 1), 256, 0, stream>>>(ptrs, size, static_cast<unsigned char*>(recv), bytes);
  launched("all-gather kernel");
}

void reduce_scatter_mean(cudaStream_t stream, const void* const* ptrs, int size, int rank, float* recv,
                         std::int64_t count) {
  if (count <= 0) return;
  reduce_scatter<<<blocks_for(count), 256, 0, stream>>>(ptrs, size, rank, recv, count);
  launched("reduce-scatter kernel");
}

void all_reduce_max(cudaStream_t stream, const void* const* ptrs, int size, int rank, std::int64_t count) {
  if (count <= 0) return;
  reduce_max<<<blocks_for(count / size + 1), 256, 0, stream>>>(ptrs, size, rank, count);
  launched("all-reduce kernel");
}

}  // namespace gtp::remat::rig

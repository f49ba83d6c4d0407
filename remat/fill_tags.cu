#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include "remat/fill_tags_cuda.h"

namespace gtp::remat {
namespace {

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// Up to N regions by value: a launch's parameters are copied with it, so a fill of a few regions
// (most fills: one per weight, contiguous ones merged) passes the small set, not all 48.
template <int N>
struct Regions {
  PoisonRegion r[N];
  int n;
};
constexpr int kSmallLaunchRegions = 4;

__device__ bool same_identity(const FillTag& a, const FillTag& b) {
  return a.weights == b.weights && a.versions == b.versions && a.count == b.count && a.magic == b.magic;
}

__global__ void write_tag_kernel(FillTag tag, FillTag* dst) { *dst = tag; }

// Every block checks the tags (a few hundred bytes, from L2 after the first block); without a mismatch
// that is all. With one, the blocks overwrite the regions in a grid-stride loop of 16-byte stores and
// block 0 writes the verdict.
template <int N>
__global__ void verify_tags_kernel(const FillTag* gathered, int count, FillTag mine, int group, Regions<N> regions,
                                   FillTagVerdict* verdict, FillTagRelease release) {
  // The stream ran everything before this kernel, the fill's tag copy too: its slot may be rewritten.
  if (release.word != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    *static_cast<volatile std::uint64_t*>(release.word) = release.value;
  }
  bool differs = false;
  for (int r = threadIdx.x; r < count; r += blockDim.x) differs = differs || !same_identity(gathered[r], mine);
  if (!__syncthreads_or(differs)) return;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
  for (int k = 0; k < regions.n; ++k) {
    auto* words = static_cast<uint4*>(regions.r[k].ptr);
    const std::int64_t n = regions.r[k].bytes / 16;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
      words[i] = ones;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && verdict->found == 0) {
    verdict->group = group;
    verdict->count = count < FillTagVerdict::kMaxRanks ? count : FillTagVerdict::kMaxRanks;
    for (int r = 0; r < verdict->count; ++r) verdict->tags[r] = gathered[r];
    __threadfence_system();  // the fields before the flag, as the host sees them
    verdict->found = 1;
  }
}

template <int N>
void launch_verify(const FillTag* gathered, int count, const FillTag& mine, int group, const PoisonRegion* first,
                   int n, FillTagVerdict* verdict, cudaStream_t stream, FillTagRelease release) {
  Regions<N> batch{};
  for (int k = 0; k < n; ++k) batch.r[k] = first[k];
  batch.n = n;
  verify_tags_kernel<N><<<64, 256, 0, stream>>>(gathered, count, mine, group, batch, verdict, release);
  check(cudaGetLastError(), "verify_fill_tags_cuda");
}

}  // namespace

void write_fill_tag_cuda(const FillTag& tag, FillTag* dst, cudaStream_t stream) {
  write_tag_kernel<<<1, 1, 0, stream>>>(tag, dst);
  check(cudaGetLastError(), "write_fill_tag_cuda");
}

void verify_fill_tags_cuda(const FillTag* gathered, int count, const FillTag& mine, int group,
                           const std::vector<PoisonRegion>& regions, FillTagVerdict* verdict, cudaStream_t stream,
                           FillTagRelease release) {
  std::size_t next = 0;
  do {  // at least one launch: a fill with no region still reports
    const int left = static_cast<int>(std::min<std::size_t>(regions.size() - next, kPoisonRegionsPerLaunch));
    const PoisonRegion* first = regions.data() + next;
    if (left <= kSmallLaunchRegions) {
      launch_verify<kSmallLaunchRegions>(gathered, count, mine, group, first, left, verdict, stream, release);
    } else {
      launch_verify<kPoisonRegionsPerLaunch>(gathered, count, mine, group, first, left, verdict, stream, release);
    }
    release = {};  // the first launch releases
    next += static_cast<std::size_t>(left);
  } while (next < regions.size());
}

CudaFillTags::CudaFillTags(const std::vector<int>& group_sizes, int ring_slots) : ring_(ring_slots) {
  try {
    for (int size : group_sizes) {
      void* buffer = nullptr;
      check(cudaMalloc(&buffer, sizeof(FillTag) * static_cast<std::size_t>(1 + size)), "cudaMalloc (fill tags)");
      buffers_.push_back(static_cast<FillTag*>(buffer));
    }
    void* verdict = nullptr;
    check(cudaHostAlloc(&verdict, sizeof(FillTagVerdict), cudaHostAllocMapped), "cudaHostAlloc (fill tag verdict)");
    verdict_ = new (verdict) FillTagVerdict();
    void* device = nullptr;
    check(cudaHostGetDevicePointer(&device, verdict, 0), "cudaHostGetDevicePointer (fill tag verdict)");
    device_verdict_ = static_cast<FillTagVerdict*>(device);
    // The ring: page-locked slots (portable: pinned for every context, never a pageable copy), their
    // release words in mapped memory, and an event per slot for a fill whose check does not run.
    const auto slots = static_cast<std::size_t>(ring_.slots());
    void* host = nullptr;
    check(cudaHostAlloc(&host, sizeof(FillTag) * slots, cudaHostAllocPortable), "cudaHostAlloc (fill tag slots)");
    slots_ = static_cast<FillTag*>(host);
    for (std::size_t s = 0; s < slots; ++s) new (slots_ + s) FillTag();
    check(cudaHostAlloc(&host, sizeof(std::uint64_t) * slots, cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc (fill tag slot releases)");
    released_ = static_cast<std::uint64_t*>(host);
    for (std::size_t s = 0; s < slots; ++s) released_[s] = 0;
    check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer (fill tag slot releases)");
    device_released_ = static_cast<std::uint64_t*>(device);
    events_.reserve(slots);
    for (std::size_t s = 0; s < slots; ++s) {
      cudaEvent_t event = nullptr;
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate (fill tag slots)");
      events_.push_back(event);
    }
  } catch (...) {
    release();
    throw;
  }
}

CudaFillTags::~CudaFillTags() { release(); }

void CudaFillTags::release() noexcept {
  // The slots may still be read by copies in flight: cudaFreeHost waits for the device, as cudaFree
  // does for the buffers (the backend synchronizes its side streams, where the runtime fills, first).
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  events_.clear();
  for (FillTag* buffer : buffers_) cudaFree(buffer);
  buffers_.clear();
  if (verdict_ != nullptr) cudaFreeHost(verdict_);
  verdict_ = nullptr;
  if (slots_ != nullptr) cudaFreeHost(slots_);
  slots_ = nullptr;
  if (released_ != nullptr) cudaFreeHost(released_);
  released_ = nullptr;
}

void CudaFillTags::write(int group, const FillTag& mine, cudaStream_t stream, bool captured) {
  abandon();  // an earlier write's check never came
  pending.stream = stream;
  pending.group = group;
  pending.mine = mine;
  int slot = -1;
  if (!captured && copy_) {
    slot = ring_.acquire(released_, [&](int s) { return cudaEventQuery(events_[s]) == cudaSuccess; });
  }
  if (slot < 0) {  // the kernel: its argument is the tag, in a graph too
    write_fill_tag_cuda(mine, send(group), stream);
    if (captured) {
      ++writes_.captured;
    } else if (copy_) {
      ++writes_.ring_full;
    } else {
      ++writes_.copy_off;
    }
    return;
  }
  // The device has read this slot's previous tag (acquire): the host may write it, then enqueue the
  // copy that reads it when the stream gets there.
  slots_[slot] = mine;
  check(cudaMemcpyAsync(send(group), slots_ + slot, sizeof(FillTag), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (fill tag)");
  pending.slot = slot;
  pending.seq = ring_.commit(slot);
  ++writes_.copied;
}

void CudaFillTags::verify(int count) {
  FillTagRelease release;
  if (pending.slot >= 0) release = {device_released_ + pending.slot, pending.seq};
  try {
    verify_fill_tags_cuda(recv(pending.group), count, pending.mine, pending.group, pending.regions, device_verdict_,
                          pending.stream, release);
  } catch (...) {
    abandon();  // the first launch, which releases, may not have gone out
    throw;
  }
  pending.slot = -1;
}

void CudaFillTags::abandon() noexcept {
  if (pending.slot < 0) return;
  const int slot = pending.slot;
  pending.slot = -1;
  ++writes_.abandoned;
  // After the copy on its stream: complete once the copy has run.
  if (cudaEventRecord(events_[slot], pending.stream) == cudaSuccess) {
    ring_.by_event(slot);
  } else {
    cudaGetLastError();  // not sticky: the next call need not see it
    ring_.lose(slot);
  }
}

}  // namespace gtp::remat

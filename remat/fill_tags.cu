#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
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
  return a.weights == b.weights && a.versions == b.versions && a.first == b.first && a.count == b.count &&
         a.magic == b.magic;
}

__global__ void write_tag_kernel(FillTag tag, FillTag* dst) { *dst = tag; }

// Every block checks the tags (a few hundred bytes, from L2 after the first block); without a mismatch
// that is all. With one, the blocks overwrite the regions in a grid-stride loop of 16-byte stores and
// block 0 writes the verdict.
template <int N>
__global__ void verify_tags_kernel(const FillTag* gathered, int count, FillTag mine, int group, Regions<N> regions,
                                   FillTagVerdict* verdict) {
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
                   int n, FillTagVerdict* verdict, cudaStream_t stream) {
  Regions<N> batch{};
  for (int k = 0; k < n; ++k) batch.r[k] = first[k];
  batch.n = n;
  verify_tags_kernel<N><<<64, 256, 0, stream>>>(gathered, count, mine, group, batch, verdict);
  check(cudaGetLastError(), "verify_fill_tags_cuda");
}

}  // namespace

void write_fill_tag_cuda(const FillTag& tag, FillTag* dst, cudaStream_t stream) {
  write_tag_kernel<<<1, 1, 0, stream>>>(tag, dst);
  check(cudaGetLastError(), "write_fill_tag_cuda");
}

void verify_fill_tags_cuda(const FillTag* gathered, int count, const FillTag& mine, int group,
                           const std::vector<PoisonRegion>& regions, FillTagVerdict* verdict, cudaStream_t stream) {
  std::size_t next = 0;
  do {  // at least one launch: a fill with no region still reports
    const int left = static_cast<int>(std::min<std::size_t>(regions.size() - next, kPoisonRegionsPerLaunch));
    const PoisonRegion* first = regions.data() + next;
    if (left <= kSmallLaunchRegions) {
      launch_verify<kSmallLaunchRegions>(gathered, count, mine, group, first, left, verdict, stream);
    } else {
      launch_verify<kPoisonRegionsPerLaunch>(gathered, count, mine, group, first, left, verdict, stream);
    }
    next += static_cast<std::size_t>(left);
  } while (next < regions.size());
}

CudaFillTags::CudaFillTags(const std::vector<int>& group_sizes) {
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
  } catch (...) {
    release();
    throw;
  }
}

CudaFillTags::~CudaFillTags() { release(); }

void CudaFillTags::release() noexcept {
  for (FillTag* buffer : buffers_) cudaFree(buffer);
  buffers_.clear();
  if (verdict_ != nullptr) cudaFreeHost(verdict_);
  verdict_ = nullptr;
}

}  // namespace gtp::remat

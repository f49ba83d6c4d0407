// The CUDA backend's fill-tag check (Backend::check_fill_tags): per group a device buffer that the
// fill's tags are gathered into, and a verdict in mapped host memory that the check kernel writes
// when the tags differ. docs/reliability.md, "Ranks that disagree".
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "remat/divergence.h"

namespace gtp::remat {

// What the check kernel leaves for the host after a mismatch (mapped host memory; `found` last).
struct FillTagVerdict {
  static constexpr int kMaxRanks = 64;  // tags kept for the message; larger groups keep their first 64
  int group = 0;
  int count = 0;  // tags in `tags` (min(G, kMaxRanks))
  FillTag tags[kMaxRanks];
  volatile unsigned found = 0;  // nonzero once the fields above are written
};

// A gathered region the check overwrites with 0xFF on a mismatch: 16-byte aligned, whole 16-byte words.
struct PoisonRegion {
  void* ptr = nullptr;
  std::int64_t bytes = 0;
};
inline constexpr int kPoisonRegionsPerLaunch = 48;

// Writes `tag` to `dst` (device memory) on `stream`: one tiny kernel, its argument the tag itself, so a
// captured fill replays the tag it was recorded with.
void write_fill_tag_cuda(const FillTag& tag, FillTag* dst, cudaStream_t stream);

// Compares the `count` gathered tags with `mine`; when any differs, sets every byte of `regions` to
// 0xFF and writes `verdict` (a device pointer to mapped host memory), once. One launch per
// kPoisonRegionsPerLaunch regions (each re-checks); a launch of up to 4 regions carries only those
// (about 170 bytes of parameters instead of about 870). Throws std::runtime_error when a launch fails.
void verify_fill_tags_cuda(const FillTag* gathered, int count, const FillTag& mine, int group,
                           const std::vector<PoisonRegion>& regions, FillTagVerdict* verdict, cudaStream_t stream);

// One backend's buffers: per group, its fill tag and the G gathered ones; the verdict.
class CudaFillTags {
 public:
  // group_sizes[g] = G of group g. Allocates (not under capture: at backend construction).
  explicit CudaFillTags(const std::vector<int>& group_sizes);
  ~CudaFillTags();
  CudaFillTags(const CudaFillTags&) = delete;
  CudaFillTags& operator=(const CudaFillTags&) = delete;

  FillTag* send(int group) const { return buffers_[group]; }
  FillTag* recv(int group) const { return buffers_[group] + 1; }
  FillTagVerdict* device_verdict() const { return device_verdict_; }
  // Null while no mismatch was found; then the verdict (it stays: the runtime is spent).
  const FillTagVerdict* found() const { return verdict_->found != 0 ? verdict_ : nullptr; }

  // The fill whose tag gather is in the open collective batch: its stream, group and tag, and the
  // gathered regions its all_gathers add (one region for gathers that follow each other in memory),
  // checked at the batch's end.
  struct Pending {
    bool open = false;
    cudaStream_t stream = nullptr;
    int group = 0;
    FillTag mine;
    std::vector<PoisonRegion> regions;
  };
  Pending pending;

 private:
  void release() noexcept;

  std::vector<FillTag*> buffers_;   // per group: [send, recv x G], device memory
  FillTagVerdict* verdict_ = nullptr;         // mapped host memory
  FillTagVerdict* device_verdict_ = nullptr;  // its device address
};

}  // namespace gtp::remat

// The CUDA backend's fill-tag check (Backend::check_fill_tags): per group a device buffer that the
// fill's tags are gathered into, a verdict in mapped host memory that the check kernel writes when
// the tags differ, and a ring of page-locked host slots that eager fills copy their tag from.
// docs/reliability.md, "Ranks that disagree".
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "remat/divergence.h"
#include "remat/fill_tag_ring.h"

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

// What the check kernel writes when it starts: `value` to `*word` (a device pointer to mapped host
// memory), telling the host that everything before it on the stream, the fill's tag copy included,
// has run (CudaFillTags' ring). Null: nothing.
struct FillTagRelease {
  std::uint64_t* word = nullptr;
  std::uint64_t value = 0;
};

// Compares the `count` gathered tags with `mine`; when any differs, sets every byte of `regions` to
// 0xFF and writes `verdict` (a device pointer to mapped host memory), once. One launch per
// kPoisonRegionsPerLaunch regions (each re-checks); a launch of up to 4 regions carries only those
// (about 170 bytes of parameters instead of about 870). The first launch writes `release`. Throws
// std::runtime_error when a launch fails.
void verify_fill_tags_cuda(const FillTag* gathered, int count, const FillTag& mine, int group,
                           const std::vector<PoisonRegion>& regions, FillTagVerdict* verdict, cudaStream_t stream,
                           FillTagRelease release = {});

// One backend's buffers: per group, its fill tag and the G gathered ones; the verdict; the ring of
// page-locked tag slots (fill_tag_ring.h) with their release words and events.
class CudaFillTags {
 public:
  // Slots in the ring: eager fills whose tag copies may be enqueued and not yet run before one falls
  // back to the kernel write. 64 bytes of page-locked memory, 8 of mapped memory and an event each.
  static constexpr int kRingSlots = 256;

  // group_sizes[g] = G of group g. Allocates and creates the ring's events (not under capture: at
  // backend construction), nothing later.
  explicit CudaFillTags(const std::vector<int>& group_sizes, int ring_slots = kRingSlots);
  ~CudaFillTags();
  CudaFillTags(const CudaFillTags&) = delete;
  CudaFillTags& operator=(const CudaFillTags&) = delete;

  FillTag* send(int group) const { return buffers_[group]; }
  FillTag* recv(int group) const { return buffers_[group] + 1; }
  FillTagVerdict* device_verdict() const { return device_verdict_; }
  // Null while no mismatch was found; then the verdict (it stays: the runtime is spent).
  const FillTagVerdict* found() const { return verdict_->found != 0 ? verdict_ : nullptr; }

  // How the tags were written, since construction.
  struct Writes {
    std::uint64_t copied = 0;      // eager: cudaMemcpyAsync from a ring slot
    std::uint64_t ring_full = 0;   // eager, by the kernel: the ring's next slot was not yet read
    std::uint64_t captured = 0;    // into a graph, by the kernel (its argument is what replays)
    std::uint64_t copy_off = 0;    // eager, by the kernel: set_copy(false)
    std::uint64_t abandoned = 0;   // copies whose check did not run: the slot waits for an event
  };
  const Writes& writes() const { return writes_; }
  const FillTagRing& ring() const { return ring_; }
  // Benchmarks and tests: false writes every tag with the kernel (the path before the ring).
  void set_copy(bool on) { copy_ = on; }

  // First in a fill (check_fill_tags): writes `mine` to send(group) on `stream`. Eagerly, from the
  // ring's next slot with a 64-byte cudaMemcpyAsync (host to device, page-locked: it never stages);
  // `captured` (the stream is being captured into a graph), or with that slot's previous copy not
  // yet run, with write_fill_tag_cuda. Sets `pending`'s stream, group, tag and slot (-1: none; the
  // backend sets the rest). A pending slot of an earlier write whose check never came is abandoned
  // first. Throws std::runtime_error when CUDA refuses the copy or the launch (no slot is then pending).
  void write(int group, const FillTag& mine, cudaStream_t stream, bool captured);
  // After the fill's collectives: the check (verify_fill_tags_cuda on `pending`, over `count` tags),
  // whose kernel releases the pending slot. Throws as verify_fill_tags_cuda (the slot is abandoned).
  void verify(int count);
  // The fill's check will not run (its batch was cancelled, or failed before the check): the slot's
  // copy still runs, so the slot is released by an event recorded after it on its stream (lost for
  // good if even that fails). No-op without a pending slot.
  void abandon() noexcept;

  // The fill whose tag gather is in the open collective batch: its stream, group and tag, and the
  // gathered regions its all_gathers add (one region for gathers that follow each other in memory),
  // checked at the batch's end.
  struct Pending {
    bool open = false;
    cudaStream_t stream = nullptr;
    int group = 0;
    FillTag mine;
    std::vector<PoisonRegion> regions;
    int slot = -1;               // the ring slot its tag was copied from; -1: the kernel wrote it
    std::uint64_t seq = 0;       // that use's sequence number (what the check kernel releases it with)
  };
  Pending pending;

 private:
  void release() noexcept;

  std::vector<FillTag*> buffers_;   // per group: [send, recv x G], device memory
  FillTagVerdict* verdict_ = nullptr;         // mapped host memory
  FillTagVerdict* device_verdict_ = nullptr;  // its device address
  FillTagRing ring_;
  FillTag* slots_ = nullptr;                      // ring_.slots() tags, page-locked host memory
  std::uint64_t* released_ = nullptr;         // their release words, mapped host memory (0 at first)
  std::uint64_t* device_released_ = nullptr;  // their device address
  std::vector<cudaEvent_t> events_;               // per slot, for abandon(); created at construction
  bool copy_ = true;
  Writes writes_;
};

}  // namespace gtp::remat

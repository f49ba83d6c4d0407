// The bookkeeping of the CUDA backend's ring of page-locked fill-tag slots (fill_tags_cuda.h), without
// CUDA: which slot the next eager fill copies its tag from, and when the host may write a slot again.
//
// An eager fill writes its tag into a host slot and enqueues a cudaMemcpyAsync from it; the copy reads
// the slot when the stream reaches it, so the host may not write that slot again before then. Each use
// of a slot gets a sequence number; the fill's check kernel (which runs after the copy, in stream
// order) writes that number into the slot's release word in mapped host memory. A slot is free again
// once its word holds its latest sequence number. A fill whose check kernel does not run (its batch
// cancelled or failed) is released by an event recorded after its copy instead. The slots are used in
// order; when the next one is not free the fill writes its tag another way (the kernel) and the ring
// does not wait: acquire() returns -1.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gtp::remat {

class FillTagRing {
 public:
  // What frees a slot again.
  enum class Gate : unsigned char {
    kFree,   // never used, or its latest use was seen released
    kWord,   // its release word equals seq(slot): the check kernel wrote it
    kEvent,  // its event completed (the check kernel will not run; the event follows the copy)
    kLost,   // never (not even an event could be recorded): skipped from then on
  };

  explicit FillTagRing(int slots) : slots_(slots > 0 ? static_cast<std::size_t>(slots) : 0) {
    if (slots <= 0) throw std::invalid_argument("FillTagRing: " + std::to_string(slots) + " slots; give at least 1");
  }

  int slots() const { return static_cast<int>(slots_.size()); }
  int head() const { return head_; }
  Gate gate(int slot) const { return slots_[static_cast<std::size_t>(slot)].gate; }
  std::uint64_t seq(int slot) const { return slots_[static_cast<std::size_t>(slot)].seq; }
  int lost() const { return lost_; }

  // The slot the next copy may use (the head), or -1 when the head's latest copy may not have been
  // read yet, or every slot is lost. `released[s]` is slot s's release word (slots() of them);
  // `event_done(s)` says whether slot s's event has completed (asked only of a kEvent slot). Lost
  // slots at the head are stepped over. Never waits.
  template <typename EventDone>
  int acquire(const volatile std::uint64_t* released, EventDone&& event_done) {
    for (std::size_t tried = 0; tried < slots_.size(); ++tried) {
      Slot& s = slots_[static_cast<std::size_t>(head_)];
      switch (s.gate) {
        case Gate::kFree:
          return head_;
        case Gate::kWord:
          if (released[head_] != s.seq) return -1;
          break;
        case Gate::kEvent:
          if (!event_done(head_)) return -1;
          break;
        case Gate::kLost:
          head_ = next(head_);
          continue;
      }
      // Released: the device has read the slot. Its next contents are written after this load.
      std::atomic_thread_fence(std::memory_order_acquire);
      s.gate = Gate::kFree;
      return head_;
    }
    return -1;
  }

  // The copy from `slot` (what acquire() returned) is enqueued: the head moves past it. Returns the
  // sequence number the check kernel writes to the slot's release word.
  std::uint64_t commit(int slot) {
    if (slot != head_ || slots_[static_cast<std::size_t>(slot)].gate != Gate::kFree) {
      throw std::logic_error("FillTagRing::commit of slot " + std::to_string(slot) + ", which acquire did not give");
    }
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    s.seq = ++last_seq_;
    s.gate = Gate::kWord;
    head_ = next(head_);
    return s.seq;
  }

  // The check kernel of the copy from `slot` will not run: the slot is free once its event completes
  // (recorded after the copy, on its stream) ...
  void by_event(int slot) { slots_[static_cast<std::size_t>(slot)].gate = Gate::kEvent; }
  // ... or never (the event could not be recorded).
  void lose(int slot) {
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    if (s.gate != Gate::kLost) ++lost_;
    s.gate = Gate::kLost;
  }

 private:
  struct Slot {
    std::uint64_t seq = 0;  // of the latest use; 0: never used (the release words start at 0)
    Gate gate = Gate::kFree;
  };
  int next(int slot) const { return slot + 1 == static_cast<int>(slots_.size()) ? 0 : slot + 1; }

  std::vector<Slot> slots_;
  int head_ = 0;
  std::uint64_t last_seq_ = 0;  // sequence numbers start at 1, so a fresh word (0) releases nothing
  int lost_ = 0;
};

}  // namespace gtp::remat

// Cache: the buffers materialized weights live in, keyed by lifetime rather than by shape.
//
// A slot is one backend allocation holding one materialize call's weights (gathered chunks, then the
// unpacked outputs). Its key is (slot, generation): the generation advances each time the slot is
// refilled, so a lease names exactly one filling. A slot is Free, Prefetched (filled ahead of its
// consumer, tagged with its chain and position), Held (by consumers until each releases it: a key
// materialized again while held shares its slot) or Kept (released, but kept gathered for a later
// materialize of the same weights: keep_gathered). A freed slot keeps every consumer's release event
// (and the event of a fill nobody consumed); whoever refills it first makes its filling stream wait on
// them, so reuse is ordered after every release on the device timeline, never by a host sync,
// whichever side stream filled it before.
//
// Addresses are stable: slots are allocated in warm-up, all sized for the largest call seen, and only
// grow (counted) when a larger call comes; in steady state nothing is allocated. Growing frees the old
// buffer, which on CUDA (cudaFree) waits for the device: a warm-up cost, never a steady-state one.
// The budget caps the bytes of all slots: kept slots make room first (the least recently filled);
// then a prefetch that would exceed it waits (returns no slot, counted) and an on-demand fill evicts
// prefetched slots. The runtime keeps one Cache per group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/chain.h"

namespace gtp::remat {

struct CacheConfig {
  std::int64_t budget_bytes = 0;  // 0: no limit
  bool poison_released = false;   // fill freed slots with 0xFF bytes (NaN in BF16/FP32), for tests
  std::string name;               // the owner in messages (the runtime: its group), or empty
};

struct CacheStats {
  std::int64_t slots = 0;
  std::int64_t slot_bytes = 0;          // sum of slot capacities
  std::int64_t peak_bytes = 0;          // most capacity held by filled slots (Prefetched, Held) at once
  std::int64_t budget_waits = 0;        // prefetches deferred by the budget
  std::int64_t evictions = 0;           // kept or prefetched slots freed to make room within the budget
  std::int64_t dropped_prefetches = 0;  // prefetched slots dropped unused (mismatch, stale weights)
  std::int64_t kept_dropped = 0;        // kept slots freed because their weights changed (or a reset)
};

class Cache {
 public:
  enum class State { kFree, kPrefetched, kHeld, kKept };
  struct Slot {
    void* ptr = nullptr;
    std::int64_t capacity = 0;
    std::uint64_t generation = 0;          // fills of this slot
    std::uint64_t filled = 0;              // cache-wide fill sequence number of the latest fill
    State state = State::kFree;
    ChainKey key;                          // the weights it holds (Prefetched, Held)
    std::vector<std::uint64_t> versions;   // their pack versions when gathered
    int chain = -1;                        // Prefetched: the chain and position it was fetched for
    std::int64_t position = -1;
    int consumers = 0;                     // Held
    bool keep = false;                     // Kept after its last release, not freed
    Stream filler = nullptr;               // the side stream that fills it (since the latest take)
    Event ready = 0;                       // filler event after the fill, kept while the slot is
                                           // Held or Kept for every later consumer to wait on
    std::vector<Event> releases;           // events the next filler waits on: consumers' releases,
                                           // an unconsumed fill, the poison fill
    std::vector<Stream> release_streams;   // while `keep`: the stream of each release (one per stream)
  };

  Cache(Backend& backend, CacheConfig config) : backend_(backend), config_(config) {}
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // A free slot of at least `bytes`, its generation advanced and `filler` (the side stream that will
  // write it) ordered after its previous consumers' releases. Kept slots, then (on demand) prefetched
  // slots, are evicted if the budget requires; when even that is not enough, throws
  // std::runtime_error naming the budget. For a prefetch returns -1 (and counts a budget wait) instead.
  int take(std::int64_t bytes, bool on_demand, Stream filler);

  Slot& slot(int index) { return slots_[index]; }
  const Slot& slot(int index) const { return slots_[index]; }
  int size() const { return static_cast<int>(slots_.size()); }
  // The prefetched slot for (chain, position), or -1.
  int find_prefetched(int chain, std::int64_t position) const;
  // Drops a prefetched slot unused, or a kept slot (each counted).
  void drop(int index);
  // A held slot's consumer is done: records its event (`stream`: where it was recorded), frees the slot
  // after the last one, or keeps it (State::kKept) when slot.keep. A kept slot keeps one release event
  // per stream, the latest: in stream order it completes after the earlier ones.
  void release(int index, Event event, Stream stream = nullptr);
  // The oldest held slot with `key`, or -1.
  int find_held(const ChainKey& key) const;
  // The slot that keeps `key` gathered (Kept, or Held with slot.keep), or -1.
  int find_kept(const ChainKey& key) const;
  // Frees every prefetched and kept slot (reset); held slots stay with their consumers (and are freed
  // at their last release).
  void drop_unheld();

  const CacheStats& stats() const { return stats_; }
  // Times a slot's buffer moved (grown to a larger call): what was recorded with its old address
  // (FillGraphs) must not run again.
  std::uint64_t relocations() const { return relocations_; }

 private:
  void free_slot(Slot& slot);

  Backend& backend_;
  CacheConfig config_;
  std::vector<Slot> slots_;
  std::uint64_t fills_ = 0;
  std::int64_t largest_ = 0;  // the largest take() so far: the size of new and grown slots
  std::uint64_t relocations_ = 0;
  CacheStats stats_;
};

}  // namespace gtp::remat

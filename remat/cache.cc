#include "remat/cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gtp::remat {

Cache::~Cache() {
  for (Slot& slot : slots_) {
    for (Event event : slot.releases) backend_.forget(event);
    if (slot.ready != 0) backend_.forget(slot.ready);
    backend_.deallocate(slot.ptr, slot.capacity);
  }
}

int Cache::take(std::int64_t bytes, bool on_demand, Stream filler) {
  const auto fits_budget = [&](std::int64_t extra) {
    return config_.budget_bytes == 0 || stats_.slot_bytes + extra <= config_.budget_bytes;
  };
  // Every slot is sized for the largest call seen so far, so any free slot serves any call and the
  // slot count settles at the largest number in use at once.
  largest_ = std::max(largest_, bytes);
  for (;;) {
    int best = -1;
    for (int i = 0; i < size() && best < 0; ++i) {
      if (slots_[i].state == State::kFree && slots_[i].capacity >= bytes) best = i;
    }
    for (int i = 0; i < size() && best < 0; ++i) {  // grow a free slot
      Slot& s = slots_[i];
      if (s.state != State::kFree || !fits_budget(largest_ - s.capacity)) continue;
      backend_.deallocate(s.ptr, s.capacity);
      stats_.slot_bytes -= s.capacity;
      s.ptr = backend_.allocate(largest_);
      s.capacity = largest_;
      stats_.slot_bytes += largest_;
      best = i;
      ++relocations_;
    }
    if (best < 0 && fits_budget(largest_)) {
      Slot s;
      s.ptr = backend_.allocate(largest_);
      s.capacity = largest_;
      stats_.slot_bytes += largest_;
      ++stats_.slots;
      slots_.push_back(std::move(s));
      best = size() - 1;
    }
    if (best >= 0) {
      Slot& s = slots_[best];
      std::int64_t filled = s.capacity;  // this slot and every other that holds a key
      for (const Slot& other : slots_) {
        if (other.state != State::kFree) filled += other.capacity;
      }
      stats_.peak_bytes = std::max(stats_.peak_bytes, filled);
      for (Event event : s.releases) {
        backend_.wait(filler, event);
        backend_.forget(event);
      }
      s.releases.clear();
      s.filler = filler;
      ++s.generation;
      s.filled = ++fills_;
      return best;
    }
    // Kept slots make room first, the least recently filled one first (a prefetch too: the window's
    // gathers come before weights kept for a consume that may not follow); then, on demand, prefetches.
    int victim = -1;
    for (int i = 0; i < size(); ++i) {
      if (slots_[i].state == State::kKept && (victim < 0 || slots_[i].filled < slots_[victim].filled)) victim = i;
    }
    if (victim < 0) {
      if (!on_demand) {
        ++stats_.budget_waits;
        return -1;
      }
      for (int i = 0; i < size(); ++i) {
        if (slots_[i].state == State::kPrefetched) victim = i;
      }
    }
    if (victim < 0) {
      throw std::runtime_error((config_.name.empty() ? std::string() : config_.name + ": ") + "memory budget of " + std::to_string(config_.budget_bytes) + " bytes cannot hold " +
                               std::to_string(bytes) + " more bytes while " + std::to_string(stats_.slot_bytes) +
                               " bytes are held by consumers; raise the budget or release weights sooner");
    }
    free_slot(slots_[victim]);
    ++stats_.evictions;
  }
}

int Cache::find_prefetched(int chain, std::int64_t position) const {
  for (int i = 0; i < size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kPrefetched && s.chain == chain && s.position == position) return i;
  }
  return -1;
}

int Cache::find_kept(const ChainKey& key) const {
  for (int i = 0; i < size(); ++i) {
    const Slot& s = slots_[i];
    if (s.keep && (s.state == State::kKept || s.state == State::kHeld) && s.key == key) return i;
  }
  return -1;
}

int Cache::find_held(const ChainKey& key) const {
  int found = -1;
  for (int i = 0; i < size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kHeld && s.key == key && (found < 0 || s.filled < slots_[found].filled)) found = i;
  }
  return found;
}

void Cache::free_slot(Slot& slot) {
  slot.state = State::kFree;
  slot.key.clear();
  slot.versions.clear();
  slot.chain = -1;
  slot.position = -1;
  slot.consumers = 0;
  slot.keep = false;
  slot.release_streams.clear();
  if (slot.ready != 0) {  // a fill nobody consumed: the next filler (maybe another stream) waits on it
    slot.releases.push_back(slot.ready);
    slot.ready = 0;
  }
  if (config_.poison_released) {
    // On the stream that filled it, after every release; the next filler waits on the poison instead.
    for (Event event : slot.releases) {
      backend_.wait(slot.filler, event);
      backend_.forget(event);
    }
    backend_.fill(slot.filler, slot.ptr, 0xFF, slot.capacity);
    slot.releases.assign(1, backend_.record(slot.filler));
  }
}

void Cache::drop(int index) {
  ++(slots_[index].state == State::kKept ? stats_.kept_dropped : stats_.dropped_prefetches);
  free_slot(slots_[index]);
}

void Cache::drop_unheld() {
  for (int i = 0; i < size(); ++i) {
    if (slots_[i].state == State::kPrefetched || slots_[i].state == State::kKept) drop(i);
    if (slots_[i].state == State::kHeld) slots_[i].keep = false;  // freed at its last release
  }
}

void Cache::release(int index, Event event, Stream stream) {
  Slot& slot = slots_[index];
  if (slot.keep) {
    const auto same = std::find(slot.release_streams.begin(), slot.release_streams.end(), stream);
    if (same != slot.release_streams.end()) {
      Event& earlier = slot.releases[static_cast<std::size_t>(same - slot.release_streams.begin())];
      backend_.forget(earlier);
      earlier = event;
    } else {
      slot.releases.push_back(event);
      slot.release_streams.push_back(stream);
    }
  } else {
    slot.releases.push_back(event);
  }
  if (--slot.consumers > 0) return;
  if (slot.keep) {
    slot.state = State::kKept;
  } else {
    // Each consumer waited on the fill before its release: the next filler waits on the releases.
    if (slot.ready != 0) backend_.forget(slot.ready);
    slot.ready = 0;
    free_slot(slot);
  }
}

}  // namespace gtp::remat

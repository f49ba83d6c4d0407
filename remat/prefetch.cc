// The Runtime's prefetch windows: which keys each group keeps gathered ahead, along the recorded
// step schedule (refill_schedule, in batches of GroupConfig::prefetch_batch) or, off it, along the
// active chain (refill); the schedule's recording and verification (follow_schedule); and the
// prefetched state a captured step must end in (boundary). See docs/remat.md, "Step schedule" and
// "Prefetch batches".
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "remat/runtime.h"

namespace gtp::remat {

// Keeps, per group g, the next depth_g consumes of group g prefetched: along the step schedule while
// the step follows it (refill_schedule), else along `chain` to the end of its step, looking past the
// other groups' keys. At most depth_g slots of group g are prefetched over all chains: room is made by
// dropping the group's prefetches for other chains first; the group's budget may defer the rest.
void Runtime::refill(int chain) {
  if (!schedule_recording_ && schedule_in_sync_) {
    refill_schedule();
    return;
  }
  const int groups = group_count();
  // The window: chain positions in order, with their groups, until every group has its depth.
  window_scratch_.clear();
  window_group_scratch_.clear();
  count_scratch_.assign(groups, 0);
  const Chain& c = chains_[chain];
  int open = 0;  // groups whose window is not full yet
  for (const GroupConfig& group : groups_) open += group.depth > 0 ? 1 : 0;
  for (std::int64_t p = c.recording() ? c.length() : c.position(); p < c.length() && open > 0; ++p) {
    const ChainKey& key = c.at(p);
    if (!registered(key)) break;  // a weight unregistered since recording: nothing past it
    const int g = group_of(key);
    if (count_scratch_[g] == groups_[g].depth) continue;
    if (groups_[g].keep_gathered) {  // kept, or kept once an earlier entry of the window is consumed
      const auto same = [&](std::int64_t earlier) { return c.at(earlier) == key; };
      if (kept_current(key) || std::any_of(window_scratch_.begin(), window_scratch_.end(), same)) continue;
    }
    window_scratch_.push_back(p);
    window_group_scratch_.push_back(g);
    if (++count_scratch_[g] == groups_[g].depth) --open;
  }
  // The chain's prefetches outside the window go; the rest count against their group's depth.
  count_scratch_.assign(groups, 0);
  for (int g = 0; g < groups; ++g) {
    Cache& cache = *caches_[g];
    for (int i = 0; i < cache.size(); ++i) {
      const Cache::Slot& s = cache.slot(i);
      if (s.state != Cache::State::kPrefetched) continue;
      if (s.chain == chain &&
          std::find(window_scratch_.begin(), window_scratch_.end(), s.position) == window_scratch_.end()) {
        cache.drop(i);
      } else {
        ++count_scratch_[g];
      }
    }
  }
  deferred_scratch_.assign(groups, 0);
  for (std::size_t w = 0; w < window_scratch_.size(); ++w) {
    const std::int64_t position = window_scratch_[w];
    const int g = window_group_scratch_[w];
    Cache& cache = *caches_[g];
    if (deferred_scratch_[g] != 0 || cache.find_prefetched(chain, position) >= 0) continue;
    for (int i = 0; count_scratch_[g] >= groups_[g].depth && i < cache.size(); ++i) {
      if (cache.slot(i).state == Cache::State::kPrefetched && cache.slot(i).chain != chain) {
        cache.drop(i);
        --count_scratch_[g];
      }
    }
    if (count_scratch_[g] >= groups_[g].depth || !prefetch(g, c.at(position), chain, position)) {
      deferred_scratch_[g] = 1;  // retried on the next consume or release; the other groups go on
      continue;
    }
    ++count_scratch_[g];
  }
}

bool Runtime::prefetch(int group, const ChainKey& key, int chain, std::int64_t position) {
  Cache& cache = *caches_[group];
  const int index = cache.take(bytes_for(key), /*on_demand=*/false, fill_stream(key));
  if (index < 0) return false;  // the group's budget
  fill(index, key, "prefetch");
  Cache::Slot& slot = cache.slot(index);
  slot.state = Cache::State::kPrefetched;
  slot.chain = chain;
  slot.position = position;
  ++stats_.prefetches;
  ++stats_.prefetch_batches;
  ++group_stats_[group].prefetches;
  ++group_stats_[group].prefetch_batches;
  return true;
}

std::vector<std::int64_t> Runtime::boundary() const {
  std::vector<std::int64_t> out;
  for (int g = 0; g < group_count(); ++g) {
    for (int i = 0; i < caches_[g]->size(); ++i) {
      const Cache::Slot& s = caches_[g]->slot(i);
      if (s.state == Cache::State::kPrefetched) out.insert(out.end(), {g, i, s.chain, s.position});
    }
  }
  return out;
}

// Group g's window is its next depth_g entries of the schedule from the current position, past the
// entries whose keys are kept gathered (keep_gathered: nothing to gather for them). The look-ahead
// reaches the end of the recorded schedule (one step; the next step's head is prefetched at drain),
// however many entries of other groups lie between: by_group_ finds them without a scan.
void Runtime::refill_schedule() {
  const int groups = group_count();
  window_scratch_.clear();
  window_ends_scratch_.assign(groups, 0);
  for (int g = 0; g < groups; ++g) {
    const std::vector<std::int64_t>& mine = by_group_[g];
    auto next = std::lower_bound(mine.begin(), mine.end(), schedule_position_);
    const std::size_t group_start = window_scratch_.size();
    for (int taken = 0; next != mine.end() && taken < groups_[g].depth; ++next) {
      if (groups_[g].keep_gathered) {  // kept, or kept once an earlier entry of the window is consumed
        const ChainKey* key = schedule_key(*next);
        const auto same = [&](std::int64_t earlier) {
          const ChainKey* other = schedule_key(earlier);
          return other != nullptr && *other == *key;
        };
        if (key != nullptr && (kept_current(*key) || std::any_of(window_scratch_.begin() + group_start,
                                                                 window_scratch_.end(), same))) {
          continue;
        }
      }
      window_scratch_.push_back(*next);
      ++taken;
    }
    window_ends_scratch_[g] = next == mine.end() ? 1 : 0;
  }
  std::sort(window_scratch_.begin(), window_scratch_.end());  // the earliest consume is gathered first
  const auto in_window = [&](int chain, std::int64_t position) {
    for (std::int64_t i : window_scratch_) {
      if (schedule_[i].first == chain && schedule_[i].second == position) return true;
    }
    return false;
  };
  for (const std::unique_ptr<Cache>& cache : caches_) {
    for (int i = 0; i < cache->size(); ++i) {
      const Cache::Slot& s = cache->slot(i);
      if (s.state == Cache::State::kPrefetched && !in_window(s.chain, s.position)) cache->drop(i);
    }
  }
  // The window's entries not prefetched yet, in consume order; a group stops at its first entry that
  // cannot be gathered (unregistered since recording).
  deferred_scratch_.assign(groups, 0);
  due_scratch_.clear();
  for (std::int64_t i : window_scratch_) {
    const auto [chain, position] = schedule_[i];
    const int g = schedule_group_[i];
    if (deferred_scratch_[g] != 0 || caches_[g]->find_prefetched(chain, position) >= 0) continue;
    if (chain >= static_cast<int>(chains_.size()) || chains_[chain].recording() ||
        position >= chains_[chain].length()) {
      break;  // the chain was reset since the schedule was recorded
    }
    // A weight unregistered since recording: the group waits (retried on the next consume or
    // release) while the other groups go on.
    if (!registered(chains_[chain].at(position))) {
      deferred_scratch_[g] = 1;
      continue;
    }
    due_scratch_.push_back(i);
  }
  // Per group: its due prefetches go out in fills of prefetch_batch keys, in consume order; fewer wait
  // for more to fall due, except a group's next consume, which goes out at once with what is due
  // behind it (up to a batch), and the window's last entries of the step (its window reaches the end
  // of the group's schedule: nothing more falls due, so waiting would only cost lead time). Slots are
  // taken until the group's budget defers the rest.
  // Groups go in the order of their first due consume, so the earliest consume is still gathered
  // first where groups share a communicator.
  group_order_scratch_.clear();
  for (std::int64_t i : due_scratch_) {
    const int g = schedule_group_[i];
    if (std::find(group_order_scratch_.begin(), group_order_scratch_.end(), g) == group_order_scratch_.end()) {
      group_order_scratch_.push_back(g);
    }
  }
  for (int g : group_order_scratch_) {
    const std::vector<std::int64_t>& mine = by_group_[g];
    const auto next = std::lower_bound(mine.begin(), mine.end(), schedule_position_);
    const std::int64_t batch = groups_[g].prefetch_batch;
    std::int64_t due = 0;
    bool next_due = false;
    for (std::int64_t i : due_scratch_) {
      if (schedule_group_[i] != g) continue;
      next_due = next_due || (next != mine.end() && *next == i);
      ++due;
    }
    const bool window_reaches_end = window_ends_scratch_[g] != 0;
    const std::int64_t first = next_due ? std::min(due, batch) : 0;
    std::int64_t issue = window_reaches_end ? due : first + (due - first) / batch * batch;
    Cache& cache = *caches_[g];
    fills_scratch_.clear();
    for (std::size_t d = 0; d < due_scratch_.size() && issue > 0; ++d) {
      const std::int64_t i = due_scratch_[d];
      if (schedule_group_[i] != g) continue;
      const auto [chain, position] = schedule_[i];
      const ChainKey& key = chains_[chain].at(position);
      const int index = cache.take(bytes_for(key), /*on_demand=*/false, fill_stream(key));
      if (index < 0) break;  // the group's budget: the rest waits for a release
      Cache::Slot& slot = cache.slot(index);
      slot.state = Cache::State::kPrefetched;  // taken: the next take must not return it
      slot.chain = chain;
      slot.position = position;
      fills_scratch_.push_back(Fill{index, &key});
      --issue;
    }
    // The first fill holds `first` keys when the next consume leads it, the others whole batches
    // (the last one fewer at the window's end).
    std::size_t begin = 0;
    while (begin < fills_scratch_.size()) {
      const std::size_t size = std::min<std::size_t>(fills_scratch_.size() - begin,
                                                     begin == 0 && first > 0 ? first : batch);
      try {
        fill_many(fills_scratch_.data() + begin, size, "prefetch");
      } catch (...) {  // slots taken but not filled must not read as prefetched
        for (std::size_t f = begin; f < fills_scratch_.size(); ++f) {
          cache.slot(fills_scratch_[f].index).state = Cache::State::kFree;
        }
        throw;
      }
      stats_.prefetches += static_cast<std::int64_t>(size);
      group_stats_[g].prefetches += static_cast<std::int64_t>(size);
      ++stats_.prefetch_batches;
      ++group_stats_[g].prefetch_batches;
      begin += size;
    }
  }
}

const ChainKey* Runtime::schedule_key(std::int64_t entry) const {
  const auto [chain, position] = schedule_[entry];
  if (position < 0 || chain >= static_cast<int>(chains_.size()) || chains_[chain].recording() ||
      position >= chains_[chain].length()) {
    return nullptr;
  }
  const ChainKey& key = chains_[chain].at(position);
  return registered(key) ? &key : nullptr;
}

void Runtime::follow_schedule(int chain, std::int64_t position, int group) {
  if (schedule_recording_) {
    // A consume its chain did not expect (position -1) is in the schedule but in no group's windows:
    // it has no chain entry to prefetch.
    if (position >= 0) by_group_[group].push_back(static_cast<std::int64_t>(schedule_.size()));
    schedule_.emplace_back(chain, position);
    schedule_group_.push_back(group);
    return;
  }
  const std::pair<int, std::int64_t> entry(chain, position);
  const auto size = static_cast<std::int64_t>(schedule_.size());
  if (position >= 0 && schedule_position_ < size && schedule_[schedule_position_] == entry) {
    ++schedule_position_;
    schedule_in_sync_ = true;
    return;
  }
  ++schedule_mismatches_;
  const auto later = position < 0 ? schedule_.end() : std::find(schedule_.begin() + schedule_position_, schedule_.end(), entry);
  schedule_in_sync_ = later != schedule_.end();
  if (schedule_in_sync_) schedule_position_ = (later - schedule_.begin()) + 1;
}

void Runtime::clear_schedule() {
  schedule_.clear();
  schedule_group_.clear();
  for (std::vector<std::int64_t>& indices : by_group_) indices.clear();
  schedule_recording_ = true;
}

}  // namespace gtp::remat

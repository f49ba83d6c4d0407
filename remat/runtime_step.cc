// The Runtime's step boundary: the gradient calls up to drain, and shard_updated after the optimizer.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "remat/runtime.h"

namespace gtp::remat {

GradBuffer Runtime::grad_buffer(WeightId id, Stream stream, GradInit init) {
  const Backend::CallScope scope(backend_);
  join_capture(stream);
  // A captured step replays its handout without asking: it must not rely on a zero of this step.
  if (capture_in_progress(stream)) grads_.drop_declaration(id);
  return grads_.buffer(id, stream, init);
}

void Runtime::main_grads_zeroed(const WeightId* ids, std::int64_t n) {
  std::vector<WeightId> list;
  if (n == 0) {
    for (WeightId id : registry_.ids()) {
      if (registry_.get(id).desc.main_grad != nullptr) list.push_back(id);
    }
  } else {
    list = registry_.expand(ids, n);
  }
  grads_.declare_zeroed(list);
}

void Runtime::finalize(const WeightId* ids, std::int64_t n, bool last_microbatch, Stream stream) {
  const Backend::CallScope scope(backend_);
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  join_capture(stream);
  grads_.finalize(registry_.expand(ids, n), last_microbatch, stream);
  if (trace_.enabled()) trace_.add("finalize " + registry_.get(ids[0]).desc.name, "grads", start);
}

void Runtime::drain(Stream stream, Head head, bool step_ends) {
  const Backend::CallScope scope(backend_);
  const bool captured = backend_.capturing(stream);
  if (captured && head == Head::kAfterShardUpdate) {
    throw std::invalid_argument(
        "drain under CUDA graph capture cannot defer the next step's head to shard_updated (shard_updated is not "
        "captured); capture drains with the head prefetched at drain");
  }
  join_capture(stream);
  grads_.drain(stream);
  // Before the next step's head is gathered: that belongs to the next check.
  if (!config_.check_every_fill && step_ends) check_step();
  for (Chain& chain : chains_) chain.end_step();
  if (schedule_rerecord_) {
    clear_schedule();
    schedule_rerecord_ = false;
  } else if (schedule_recording_ && !schedule_.empty()) {
    schedule_recording_ = false;
  }
  if (!schedule_recording_ && schedule_position_ != 0 && schedule_position_ != static_cast<std::int64_t>(schedule_.size())) {
    ++schedule_mismatches_;  // the step ended inside the schedule
  }
  schedule_position_ = 0;
  schedule_in_sync_ = true;
  // The next step's head, prefetched across the step boundary: the schedule's first entries (the
  // forward chain of chunk 0 while no schedule is recorded).
  active_chain_ = chain_index(Phase::kForward, 0);
  head_deferred_ = head == Head::kAfterShardUpdate;
  if (!head_deferred_) refill(active_chain_);
  std::vector<std::int64_t> now = boundary();
  if (!captured && !head_deferred_) {
    // The head's gathers went out after grads_.drain joined the side streams. Joined too, so that
    // synchronizing `stream` before a capture covers them: inside the capture the first materialize's
    // wait on the head's ready event is dropped, and the first replay would read the head unfinished.
    for (int g = 0; g < backend_.group_count(); ++g) backend_.order(stream, backend_.side_stream(g, Role::kGather));
  }
  if (captured) {
    // Every fork joins the capturing stream, and each replay must leave the head where the next reads it.
    backend_.join_all(stream);
    if (now != boundary_) {
      throw std::invalid_argument(
          "drain under CUDA graph capture: the captured step ends with a different set of prefetched slots than "
          "the step before it began with, so replays would read stale weights; capture a steady-state step (run "
          "at least two eager steps with the same calls first)");
    }
  }
  boundary_ = std::move(now);
}

void Runtime::shard_updated(const WeightId* ids, std::int64_t n, Stream stream) {
  const Backend::CallScope scope(backend_);
  const ChainKey updated = registry_.expand(ids, n);
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  registry_.shard_updated(ids, n, stream);
  const std::set<WeightId> changed(updated.begin(), updated.end());
  // What is gathered again right away packs first, as every fill does (fill_many): the stale prefetched
  // slots, and the head when it follows the re-pack. The other packs wait for their first gathers.
  bool dropped_kept = false;
  for (const std::unique_ptr<Cache>& cache : caches_) {
    for (int i = 0; i < cache->size(); ++i) {
      Cache::Slot& slot = cache->slot(i);
      if (std::none_of(slot.key.begin(), slot.key.end(), [&](WeightId id) { return changed.count(id) != 0; })) continue;
      if (slot.state == Cache::State::kKept) {
        cache->drop(i);  // gathered from the old shards: the next materialize gathers again
        dropped_kept = true;
        continue;
      }
      if (slot.state == Cache::State::kHeld) slot.keep = false;  // freed at its last release
      if (slot.state != Cache::State::kPrefetched) continue;
      const ChainKey key = slot.key;
      fill(i, key, "regather");  // in place: the slot has no consumer, its address stays
      ++stats_.stale_prefetches;
    }
  }
  if (head_deferred_) {  // drain(.., kAfterShardUpdate): the head, gathered from the new shards
    head_deferred_ = false;
    refill(active_chain_);
    boundary_ = boundary();
  } else if (dropped_kept && active_chain_ >= 0) {
    // The windows skipped keys that were kept (the head, after a drain): gather them now.
    refill(active_chain_);
  }
  if (trace_.enabled()) trace_.add("shard_updated x" + std::to_string(updated.size()), "repack", start);
}

}  // namespace gtp::remat

// The Runtime's consumer calls: materialize (a prefetched, kept or on-demand slot) and release.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/runtime.h"

namespace gtp::remat {

std::vector<void*> Runtime::materialize(const WeightId* ids, std::int64_t n, Phase phase, int chunk, Layout layout,
                                        Stream stream) {
  std::vector<void*> out;
  for (const Materialized& m : materialize_views(ids, n, phase, chunk, layout, stream)) out.push_back(m.data);
  return out;
}

std::vector<Materialized> Runtime::materialize_views(const WeightId* ids, std::int64_t n, Phase phase, int chunk,
                                                     Layout layout, Stream stream) {
  const Backend::CallScope scope(backend_);
  if (layout != Layout::kBF16 && layout != Layout::kGemm) {
    throw std::invalid_argument("layout " + std::to_string(static_cast<int>(layout)) + " is unknown; use BF16 or GEMM");
  }
  const ChainKey key(registry_.expand(ids, n), layout);
  for (WeightId id : key) {
    const Weight& w = registry_.get(id);
    if (w.version == 0) {
      throw std::invalid_argument("materialize: weight '" + w.desc.name +
                                  "' was never packed; call shard_updated on it (collectively) after register");
    }
  }
  const int group = group_of(key);
  Cache& cache = *caches_[group];
  // A key a consumer still holds is shared with it (below): release names weights, not buffers, so two
  // buffers for one key would leave it to chance which one a release frees while the caller reads it.
  // One held from before a re-pack cannot serve the new shards, nor can a second buffer be taken.
  const int held = cache.find_held(key);
  if (held >= 0 && cache.slot(held).versions != versions(key) && !kept_current(key)) {
    throw std::invalid_argument("materialize: weight '" + registry_.get(key.front()).desc.name + "'" +
                                (key.size() > 1 ? " and the others listed are" : " is") +
                                " still materialized from before a shard_updated; release that use first");
  }
  const int c = chain_index(phase, chunk);
  head_deferred_ = false;  // the step began without the deferred head: it is gathered on demand
  join_capture(stream);
  const bool recording = chains_[c].recording();
  const Chain::Consume consumed = chains_[c].consume(key);
  follow_schedule(c, recording ? chains_[c].length() - 1 : consumed.position, group);
  // A chain first used after the schedule was recorded (say, recompute switched on) is not in it:
  // record the schedule again over the next step.
  if (recording && !schedule_recording_) schedule_rerecord_ = true;
  int index = consumed.position >= 0 ? cache.find_prefetched(c, consumed.position) : -1;
  if (index >= 0 && cache.slot(index).versions != versions(key)) {
    cache.drop(index);  // shard_updated re-gathers prefetched slots, so this is only a safety net
    ++stats_.stale_prefetches;
    index = -1;
  }
  // A key kept gathered is served from its slot, shared with any consumer still holding it; a
  // prefetch made for this consume before the key was kept (the recording step) is not needed.
  const bool kept = kept_current(key);
  const bool shared = !kept && held >= 0;
  if (kept || shared) {
    if (index >= 0) cache.drop(index);
    index = kept ? cache.find_kept(key) : held;
  }
  const bool hit = index >= 0;
  if (kept) {
    ++stats_.kept_hits;
    ++group_stats_[group].kept_hits;
  } else if (shared) {
    ++stats_.shared_hits;
    ++group_stats_[group].shared_hits;
  } else if (hit) {
    ++stats_.prefetch_hits;
    ++group_stats_[group].prefetch_hits;
  } else {
    index = cache.take(bytes_for(key), /*on_demand=*/true, fill_stream(key));
    fill(index, key, "exposed");
    ++stats_.exposed_gathers;
    ++group_stats_[group].exposed_gathers;
  }
  for (WeightId id : key) {
    WeightStats& w = weight_stats_[id];  // fill() sized it when the key was first gathered
    ++w.materializations;
    if (!kept && !shared) ++(hit ? w.prefetch_hits : w.exposed_gathers);
  }
  Cache::Slot& slot = cache.slot(index);
  slot.state = Cache::State::kHeld;
  slot.chain = -1;
  slot.position = -1;
  if (kept || shared) {
    ++slot.consumers;
  } else {
    slot.consumers = 1;
    slot.keep = groups_[group].keep_gathered;
  }
  backend_.wait(stream, slot.ready);  // kept while the slot is held or kept: later consumers wait on it too
  ++stats_.materializations;
  ++group_stats_[group].materializations;
  active_chain_ = c;
  std::vector<Materialized> out = outputs(index, key);
  refill(c);
  return out;
}

void Runtime::release(const WeightId* ids, std::int64_t n, Stream stream, std::optional<Layout> layout) {
  const Backend::CallScope scope(backend_);
  ChainKey key(registry_.expand(ids, n), layout.value_or(Layout::kBF16));
  Cache& cache = *caches_[group_of(key)];
  if (!layout) {
    const int bf16 = cache.find_held(key);
    key.layout = Layout::kGemm;
    const int gemm = cache.find_held(key);
    if (bf16 >= 0 && gemm >= 0) {
      throw std::invalid_argument("release: weight '" + registry_.get(key.front()).desc.name +
                                  "' is materialized in both the BF16 and the GEMM layout; name the layout to release");
    }
    if (gemm < 0) key.layout = Layout::kBF16;
  }
  const int index = cache.find_held(key);
  if (index < 0) {
    throw std::invalid_argument("release: weight '" + registry_.get(key.front()).desc.name + "'" +
                                (key.size() > 1 ? " and the others listed are" : " is") + " not materialized" + (layout ? " in the " + to_string(*layout) + " layout" : std::string()) +
                                " (a double release, or a release without materialize); "
                                "release exactly the ids passed to materialize, once");
  }
  join_capture(stream);
  cache.release(index, backend_.record(stream), stream);
  if (active_chain_ >= 0) refill(active_chain_);
}

}  // namespace gtp::remat

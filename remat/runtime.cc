#include "remat/runtime.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace gtp::remat {
namespace {

constexpr int kPhases = 3;

// The GEMM-ready sections of `w` in the output region at `region`; absent sections stay null.
kernels::GemmOutputs gemm_outputs(const Weight& w, char* region) {
  const GemmPlacement& p = w.gemm;
  kernels::GemmOutputs out;
  out.data = region + p.data;
  out.data_capacity = p.sizes.data_bytes;
  if (p.sizes.scales_bytes > 0) {
    out.scales = region + p.scales;
    out.scales_capacity = p.sizes.scales_bytes;
  }
  if (p.sizes.transpose_supported) {
    out.transposed_data = region + p.transposed_data;
    out.transposed_data_capacity = p.sizes.transposed_data_bytes;
    if (p.sizes.transposed_scales_bytes > 0) {
      out.transposed_scales = region + p.transposed_scales;
      out.transposed_scales_capacity = p.sizes.transposed_scales_bytes;
    }
  }
  if (p.sizes.decode_scale_count > 0) {
    out.decode_scales = reinterpret_cast<float*>(region + p.decode_scales);
    out.decode_scales_capacity = p.sizes.decode_scale_count;
  }
  return out;
}

}  // namespace

Runtime::Runtime(Backend& backend, RuntimeConfig config)
    : backend_(backend), config_(std::move(config)), registry_(backend), cache_(backend, config_.cache),
      grads_(backend, registry_, config_.grads), trace_(config_.trace_spans) {
  if (config_.depth < 0 || config_.depth > kMaxDepth) {
    throw std::invalid_argument("prefetch depth " + std::to_string(config_.depth) + " is out of range; use 0.." +
                                std::to_string(kMaxDepth));
  }
  if (config_.cache.budget_bytes < 0) {
    throw std::invalid_argument("memory budget " + std::to_string(config_.cache.budget_bytes) +
                                " is negative; use 0 (no limit) or a byte count");
  }
}

int Runtime::chain_index(Phase phase, int chunk) {
  const int p = static_cast<int>(phase);
  if (p < 0 || p >= kPhases) {
    throw std::invalid_argument("phase " + std::to_string(p) + " is not forward, backward or recompute");
  }
  if (chunk < 0) {
    throw std::invalid_argument("model chunk " + std::to_string(chunk) + " is negative; chunks count from 0");
  }
  const int index = chunk * kPhases + p;
  if (index >= static_cast<int>(chains_.size())) chains_.resize(index + 1);
  return index;
}

std::int64_t Runtime::bytes_for(const ChainKey& key) const {
  std::int64_t bytes = 0;
  for (WeightId id : key) {
    const Weight& w = registry_.get(id);
    bytes += w.geometry.group_size * w.layout.chunk_bytes + w.output_bytes;
  }
  return bytes;
}

std::vector<std::uint64_t> Runtime::versions(const ChainKey& key) const {
  std::vector<std::uint64_t> out;
  for (WeightId id : key) out.push_back(registry_.get(id).version);
  return out;
}

// Slot layout, per weight of the key: the G gathered chunks, then the output region (BF16 weight or
// GEMM-ready sections, Weight::gemm), sized for the larger of the two.
// A key fills on the gather stream of its first weight's group; a key that spans groups first joins
// the other groups' gather streams, where its chunks were packed.
Stream Runtime::fill_stream(const ChainKey& key) {
  return backend_.side_stream(registry_.get(key.front()).desc.group, Role::kGather);
}

void Runtime::fill(int index, const ChainKey& key, const char* why) {
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  Cache::Slot& slot = cache_.slot(index);
  const Stream stream = slot.filler;
  std::vector<Stream>& joined = joined_scratch_;  // reused: no allocation per fill
  joined.assign(1, stream);
  for (WeightId id : key) {
    const Stream gather = backend_.side_stream(registry_.get(id).desc.group, Role::kGather);
    if (std::find(joined.begin(), joined.end(), gather) != joined.end()) continue;
    joined.push_back(gather);
    backend_.order(stream, gather);
  }
  // The key's all-gathers go out as one batch (one NCCL group on the CUDA backend), then the unpacks:
  // nothing else may sit between them on the stream, because a batch launches at its end.
  std::string names;
  {
    Backend::CollectiveBatch batch(backend_);
    char* next = static_cast<char*>(slot.ptr);
    for (WeightId id : key) {
      const Weight& w = registry_.get(id);
      const std::int64_t gathered = w.geometry.group_size * w.layout.chunk_bytes;
      backend_.all_gather(stream, w.desc.group, w.chunk, next, w.layout.chunk_bytes);
      next += gathered + w.output_bytes;
      if (id >= static_cast<WeightId>(weight_stats_.size())) weight_stats_.resize(id + 1);
      weight_stats_[id].gathered_bytes += gathered;
      if (trace_.enabled()) names += (names.empty() ? "" : ",") + w.desc.name;
    }
    batch.launch();
  }
  // The GEMM layout is unpacked per weight; the BF16 layout in one unpack_many per wire spec (one
  // kernel launch for up to kernels::kUnpackJobsPerLaunch weights on CUDA: an MoE expert group is one
  // key of many same-wire weights), the specs in the order the key first names them.
  unpacks_scratch_.clear();
  char* next = static_cast<char*>(slot.ptr);
  for (WeightId id : key) {
    const Weight& w = registry_.get(id);
    const std::int64_t gathered = w.geometry.group_size * w.layout.chunk_bytes;
    const kernels::GatheredChunks chunks{next, gathered, w.geometry};
    char* region = next + gathered;
    next = region + w.output_bytes;
    if (w.gathers_in_place) continue;  // the gathered rows are the weight
    if (key.layout == Layout::kGemm && w.desc.wire.format != kernels::WireFormat::kBF16) {
      backend_.unpack_gemm(stream, w.desc.wire, chunks, gemm_outputs(w, region));
    } else {
      unpacks_scratch_.emplace_back(w.desc.wire, kernels::UnpackJob{chunks, region, w.output_bytes});
    }
  }
  unpack_specs_scratch_.clear();
  for (const auto& unpack : unpacks_scratch_) {
    const kernels::WireSpec& spec = unpack.first;
    if (std::find(unpack_specs_scratch_.begin(), unpack_specs_scratch_.end(), spec) != unpack_specs_scratch_.end()) {
      continue;  // unpacked with the first weight of its spec
    }
    unpack_specs_scratch_.push_back(spec);
    unpack_jobs_scratch_.clear();
    for (const auto& [other, job] : unpacks_scratch_) {
      if (other == spec) unpack_jobs_scratch_.push_back(job);
    }
    backend_.unpack_many(stream, spec, unpack_jobs_scratch_);
  }
  slot.key = key;
  slot.versions = versions(key);
  if (slot.ready != 0) backend_.forget(slot.ready);  // a prefetch that was dropped or re-gathered
  slot.ready = backend_.record(stream);
  if (trace_.enabled()) trace_.add("gather " + names, why, start);
}

std::vector<Materialized> Runtime::outputs(int index, const ChainKey& key) {
  std::vector<Materialized> out;
  char* next = static_cast<char*>(cache_.slot(index).ptr);
  for (WeightId id : key) {
    const Weight& w = registry_.get(id);
    const std::int64_t gathered = w.geometry.group_size * w.layout.chunk_bytes;
    Materialized m;
    m.wire = w.desc.wire;
    m.rows = w.desc.rows;
    m.cols = w.desc.cols;
    m.shard_rows = w.geometry.shard_rows;
    m.data = w.gathers_in_place ? next : next + gathered;
    next += gathered;
    if (key.layout == Layout::kGemm && w.desc.wire.format != kernels::WireFormat::kBF16) {
      const kernels::GemmOutputs g = gemm_outputs(w, next);
      m.layout = Layout::kGemm;
      m.scales = g.scales;
      m.transposed_data = g.transposed_data;
      m.transposed_scales = g.transposed_scales;
      m.decode_scales = g.decode_scales;
      m.gemm = w.gemm.sizes;
    }
    out.push_back(m);
    next += w.output_bytes;
  }
  return out;
}

// Keeps the next `depth` consumes prefetched: the step schedule's while the step follows it
// (refill_schedule), else `chain`'s own. At most `depth` slots are prefetched over all chains: room is
// made by dropping other chains' prefetches first; the budget may defer the rest.
void Runtime::refill(int chain) {
  if (!schedule_recording_ && schedule_in_sync_) {
    refill_schedule();
    return;
  }
  const std::vector<std::int64_t> window = chains_[chain].upcoming(config_.depth);
  int prefetched = 0;
  for (int i = 0; i < cache_.size(); ++i) {
    Cache::Slot& s = cache_.slot(i);
    if (s.state != Cache::State::kPrefetched) continue;
    if (s.chain == chain && std::find(window.begin(), window.end(), s.position) == window.end()) {
      cache_.drop(i);
    } else {
      ++prefetched;
    }
  }
  for (std::int64_t position : window) {
    if (cache_.find_prefetched(chain, position) >= 0) continue;
    const ChainKey& key = chains_[chain].at(position);
    if (!std::all_of(key.begin(), key.end(), [&](WeightId id) { return registry_.contains(id); })) return;
    for (int i = 0; prefetched >= config_.depth && i < cache_.size(); ++i) {
      if (cache_.slot(i).state == Cache::State::kPrefetched && cache_.slot(i).chain != chain) {
        cache_.drop(i);
        --prefetched;
      }
    }
    if (prefetched >= config_.depth) return;
    const int index = cache_.take(bytes_for(key), /*on_demand=*/false, fill_stream(key));
    if (index < 0) return;
    fill(index, key, "prefetch");
    Cache::Slot& slot = cache_.slot(index);
    slot.state = Cache::State::kPrefetched;
    slot.chain = chain;
    slot.position = position;
    ++prefetched;
    ++stats_.prefetches;
  }
}

void Runtime::join_capture(Stream stream) {
  if (!backend_.capturing(stream)) return;
  for (int g = 0; g < backend_.group_count(); ++g) {
    for (Role role : {Role::kGather, Role::kReduceScatter}) {
      const Stream side = backend_.side_stream(g, role);
      if (!backend_.capturing(side)) backend_.order(side, stream);
    }
  }
}

std::vector<std::int64_t> Runtime::boundary() const {
  std::vector<std::int64_t> out;
  for (int i = 0; i < cache_.size(); ++i) {
    const Cache::Slot& s = cache_.slot(i);
    if (s.state == Cache::State::kPrefetched) out.insert(out.end(), {i, s.chain, s.position});
  }
  return out;
}

void Runtime::refill_schedule() {
  const std::int64_t end =
      std::min<std::int64_t>(schedule_position_ + config_.depth, static_cast<std::int64_t>(schedule_.size()));
  const auto in_window = [&](int chain, std::int64_t position) {
    for (std::int64_t i = schedule_position_; i < end; ++i) {
      if (schedule_[i].first == chain && schedule_[i].second == position) return true;
    }
    return false;
  };
  for (int i = 0; i < cache_.size(); ++i) {
    const Cache::Slot& s = cache_.slot(i);
    if (s.state == Cache::State::kPrefetched && !in_window(s.chain, s.position)) cache_.drop(i);
  }
  for (std::int64_t i = schedule_position_; i < end; ++i) {
    const auto [chain, position] = schedule_[i];
    if (cache_.find_prefetched(chain, position) >= 0) continue;
    if (chain >= static_cast<int>(chains_.size()) || chains_[chain].recording() ||
        position >= chains_[chain].length()) {
      return;  // the chain was reset since the schedule was recorded
    }
    const ChainKey& key = chains_[chain].at(position);
    if (!std::all_of(key.begin(), key.end(), [&](WeightId id) { return registry_.contains(id); })) return;
    const int index = cache_.take(bytes_for(key), /*on_demand=*/false, fill_stream(key));
    if (index < 0) return;  // the budget: retried on the next consume or release
    fill(index, key, "prefetch");
    Cache::Slot& slot = cache_.slot(index);
    slot.state = Cache::State::kPrefetched;
    slot.chain = chain;
    slot.position = position;
    ++stats_.prefetches;
  }
}

void Runtime::follow_schedule(int chain, std::int64_t position) {
  if (schedule_recording_) {
    schedule_.emplace_back(chain, position);
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
  const int c = chain_index(phase, chunk);
  head_deferred_ = false;  // the step began without the deferred head: it is gathered on demand
  join_capture(stream);
  const bool recording = chains_[c].recording();
  const Chain::Consume consumed = chains_[c].consume(key);
  follow_schedule(c, recording ? chains_[c].length() - 1 : consumed.position);
  // A chain first used after the schedule was recorded (say, recompute switched on) is not in it:
  // record the schedule again over the next step.
  if (recording && !schedule_recording_) schedule_rerecord_ = true;
  int index = consumed.position >= 0 ? cache_.find_prefetched(c, consumed.position) : -1;
  if (index >= 0 && cache_.slot(index).versions != versions(key)) {
    cache_.drop(index);  // shard_updated re-gathers prefetched slots, so this is only a safety net
    ++stats_.stale_prefetches;
    index = -1;
  }
  const bool hit = index >= 0;
  if (hit) {
    ++stats_.prefetch_hits;
  } else {
    index = cache_.take(bytes_for(key), /*on_demand=*/true, fill_stream(key));
    fill(index, key, "exposed");
    ++stats_.exposed_gathers;
  }
  for (WeightId id : key) {
    WeightStats& w = weight_stats_[id];  // fill() sized it when the key was first gathered
    ++w.materializations;
    ++(hit ? w.prefetch_hits : w.exposed_gathers);
  }
  Cache::Slot& slot = cache_.slot(index);
  slot.state = Cache::State::kHeld;
  slot.chain = -1;
  slot.position = -1;
  slot.consumers = 1;
  backend_.wait(stream, slot.ready);
  backend_.forget(slot.ready);
  slot.ready = 0;
  ++stats_.materializations;
  active_chain_ = c;
  std::vector<Materialized> out = outputs(index, key);
  refill(c);
  return out;
}

void Runtime::release(const WeightId* ids, std::int64_t n, Stream stream, std::optional<Layout> layout) {
  const Backend::CallScope scope(backend_);
  ChainKey key(registry_.expand(ids, n), layout.value_or(Layout::kBF16));
  if (!layout) {
    const int bf16 = cache_.find_held(key);
    key.layout = Layout::kGemm;
    const int gemm = cache_.find_held(key);
    if (bf16 >= 0 && gemm >= 0) {
      throw std::invalid_argument("release: weight '" + registry_.get(key.front()).desc.name +
                                  "' is materialized in both the BF16 and the GEMM layout; name the layout to release");
    }
    if (gemm < 0) key.layout = Layout::kBF16;
  }
  const int index = cache_.find_held(key);
  if (index < 0) {
    throw std::invalid_argument("release: weight '" + registry_.get(key.front()).desc.name + "'" +
                                (key.size() > 1 ? " and the others listed" : "") +
                                " are not materialized" + (layout ? " in the " + to_string(*layout) + " layout" : std::string()) +
                                " (a double release, or a release without materialize); "
                                "release exactly the ids passed to materialize, once");
  }
  join_capture(stream);
  cache_.release(index, backend_.record(stream));
  if (active_chain_ >= 0) refill(active_chain_);
}

GradBuffer Runtime::grad_buffer(WeightId id, Stream stream, GradInit init) {
  const Backend::CallScope scope(backend_);
  join_capture(stream);
  return grads_.buffer(id, stream, init);
}

void Runtime::finalize(const WeightId* ids, std::int64_t n, bool last_microbatch, Stream stream) {
  const Backend::CallScope scope(backend_);
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  join_capture(stream);
  grads_.finalize(registry_.expand(ids, n), last_microbatch, stream);
  if (trace_.enabled()) trace_.add("finalize " + registry_.get(ids[0]).desc.name, "grads", start);
}

void Runtime::drain(Stream stream, Head head) {
  const Backend::CallScope scope(backend_);
  const bool captured = backend_.capturing(stream);
  if (captured && head == Head::kAfterShardUpdate) {
    throw std::invalid_argument(
        "drain under CUDA graph capture cannot defer the next step's head to shard_updated (shard_updated is not "
        "captured); capture drains with the head prefetched at drain");
  }
  join_capture(stream);
  grads_.drain(stream);
  for (Chain& chain : chains_) chain.end_step();
  if (schedule_rerecord_) {
    schedule_.clear();
    schedule_recording_ = true;
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
  if (trace_.enabled()) trace_.add("shard_updated x" + std::to_string(updated.size()), "repack", start);
  const std::set<WeightId> changed(updated.begin(), updated.end());
  for (int i = 0; i < cache_.size(); ++i) {
    Cache::Slot& slot = cache_.slot(i);
    if (slot.state != Cache::State::kPrefetched) continue;
    if (std::none_of(slot.key.begin(), slot.key.end(), [&](WeightId id) { return changed.count(id) != 0; })) continue;
    const ChainKey key = slot.key;
    fill(i, key, "regather");  // in place: the slot has no consumer, its address stays
    ++stats_.stale_prefetches;
  }
  if (head_deferred_) {  // drain(.., kAfterShardUpdate): the head, gathered from the new shards
    head_deferred_ = false;
    refill(active_chain_);
    boundary_ = boundary();
  }
}

void Runtime::unregister_weight(WeightId id) {
  const Weight& w = registry_.get(id);
  for (int i = 0; i < cache_.size(); ++i) {
    Cache::Slot& slot = cache_.slot(i);
    if (slot.state == Cache::State::kFree || std::find(slot.key.begin(), slot.key.end(), id) == slot.key.end()) continue;
    if (slot.state == Cache::State::kHeld) {
      throw std::invalid_argument("unregister: weight '" + w.desc.name + "' is materialized; release it first");
    }
  }
  if (grads_.busy(id)) {
    throw std::invalid_argument("unregister: weight '" + w.desc.name +
                                "' has a grad buffer or a pending reduction; finalize and drain first");
  }
  registry_.remove(id);
  for (int i = 0; i < cache_.size(); ++i) {
    Cache::Slot& slot = cache_.slot(i);
    if (slot.state == Cache::State::kPrefetched && std::find(slot.key.begin(), slot.key.end(), id) != slot.key.end()) {
      cache_.drop(i);
    }
  }
}

bool Runtime::capture_in_progress(Stream stream) {
  const Backend::CallScope scope(backend_);
  if (backend_.capturing(stream)) return true;
  for (int g = 0; g < backend_.group_count(); ++g) {
    for (Role role : {Role::kGather, Role::kReduceScatter}) {
      if (backend_.capturing(backend_.side_stream(g, role))) return true;
    }
  }
  return false;
}

void Runtime::reset_chains() {
  for (Chain& chain : chains_) chain.reset();
  head_deferred_ = false;
  schedule_.clear();
  schedule_recording_ = true;
  schedule_position_ = 0;
  schedule_in_sync_ = false;
  schedule_rerecord_ = false;
  cache_.drop_all_prefetched();
  active_chain_ = -1;
}

WeightStats Runtime::weight_stats(WeightId id) const {
  registry_.get(id);  // throws for an unknown id
  return id < static_cast<WeightId>(weight_stats_.size()) ? weight_stats_[id] : WeightStats{};
}

RuntimeStats Runtime::stats() const {
  RuntimeStats out = stats_;
  out.schedule_mismatches = schedule_mismatches_;
  for (const Chain& chain : chains_) {
    out.chain_mismatches += chain.mismatches();
    if (!chain.last_mismatch().empty()) out.last_mismatch = chain.last_mismatch();
  }
  return out;
}

std::string Runtime::stats_json() const {
  const RuntimeStats s = stats();
  const CacheStats& c = cache_.stats();
  const GradsStats& g = grads_.stats();
  const MemoryStats& m = backend_.memory();
  nlohmann::json j;
  j["backend"] = backend_.name();
  j["depth"] = config_.depth;
  j["materialize"] = {{"calls", s.materializations}, {"prefetch_hits", s.prefetch_hits},
                      {"exposed_gathers", s.exposed_gathers}, {"prefetches", s.prefetches},
                      {"stale_prefetches", s.stale_prefetches}};
  j["chains"] = {{"mismatches", s.chain_mismatches}, {"last_mismatch", s.last_mismatch},
                 {"schedule_entries", schedule_.size()}, {"schedule_mismatches", s.schedule_mismatches}};
  j["cache"] = {{"slots", c.slots}, {"slot_bytes", c.slot_bytes}, {"budget_bytes", config_.cache.budget_bytes},
                {"budget_waits", c.budget_waits}, {"evictions", c.evictions},
                {"dropped_prefetches", c.dropped_prefetches}};
  j["grads"] = {{"reduce_scatters", g.reduce_scatters}, {"grads_ready", g.grads_ready},
                {"pool_buffers", g.pool_buffers}};
  j["memory"] = {{"allocations", m.allocations}, {"bytes_in_use", m.bytes_in_use}, {"peak_bytes", m.peak_bytes}};
  j["trace"] = {{"spans", config_.trace_spans}, {"dropped", trace_.dropped()}};
  nlohmann::json weights = nlohmann::json::array();
  for (WeightId id = 0; id < static_cast<WeightId>(weight_stats_.size()); ++id) {
    if (!registry_.contains(id)) continue;
    const WeightStats& w = weight_stats_[id];
    weights.push_back({{"id", id}, {"name", registry_.get(id).desc.name}, {"materializations", w.materializations},
                       {"prefetch_hits", w.prefetch_hits}, {"exposed_gathers", w.exposed_gathers},
                       {"gathered_bytes", w.gathered_bytes}});
  }
  j["weights"] = weights;
  return j.dump();
}

}  // namespace gtp::remat

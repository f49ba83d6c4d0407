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
  out.scale_layout = p.sizes.scale_layout;
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

namespace {

// The groups' settings: RuntimeConfig::groups, or depth and cache.budget_bytes for every group.
std::vector<GroupConfig> resolve_groups(const RuntimeConfig& config, int group_count) {
  const bool per_group = !config.groups.empty();
  if (per_group && static_cast<int>(config.groups.size()) != group_count) {
    throw std::invalid_argument("RuntimeConfig::groups has " + std::to_string(config.groups.size()) +
                                " entries but the backend has " + std::to_string(group_count) +
                                " groups; give one entry per group, or none (depth and cache.budget_bytes for all)");
  }
  std::vector<GroupConfig> out;
  for (int g = 0; g < group_count; ++g) {
    GroupConfig group =
        per_group ? config.groups[g]
                  : GroupConfig{config.depth,         config.cache.budget_bytes, {},
                                config.prefetch_batch, config.keep_gathered,      config.fill_graphs,
                                config.grads_into_main_grad};
    if (group.name.empty()) group.name = "group " + std::to_string(g);
    const std::string who = per_group ? group.name + " (RuntimeConfig::groups[" + std::to_string(g) + "])"
                                      : std::string("RuntimeConfig (every group)");
    if (group.depth < 0 || group.depth > kMaxDepth) {
      throw std::invalid_argument(who + ": prefetch depth " + std::to_string(group.depth) + " is out of range; use 0.." +
                                  std::to_string(kMaxDepth) + " (0: the group's keys are gathered on demand)");
    }
    if (group.prefetch_batch < 1 || group.prefetch_batch > std::max(group.depth, 1)) {
      throw std::invalid_argument(who + ": prefetch batch " + std::to_string(group.prefetch_batch) +
                                  " is out of range; use 1.." + std::to_string(std::max(group.depth, 1)) +
                                  " (prefetches issued together, at most the prefetch depth " +
                                  std::to_string(group.depth) + ")");
    }
    if (group.fill_graphs < 0) {
      throw std::invalid_argument(who + ": fill_graphs " + std::to_string(group.fill_graphs) +
                                  " is negative; use 0 (fills run eagerly) or the most fill graphs to keep");
    }
    if (group.budget_bytes < 0) {
      throw std::invalid_argument(who + ": memory budget " + std::to_string(group.budget_bytes) +
                                  " is negative; use 0 (no limit) or a byte count");
    }
    out.push_back(std::move(group));
  }
  return out;
}

GradsConfig grads_config(GradsConfig config, const std::vector<GroupConfig>& groups) {
  config.into_main_grad.clear();
  for (const GroupConfig& group : groups) config.into_main_grad.push_back(group.grads_into_main_grad);
  return config;
}

}  // namespace

Runtime::Runtime(Backend& backend, RuntimeConfig config)
    : backend_(backend), config_(std::move(config)), groups_(resolve_groups(config_, backend.group_count())),
      registry_(backend),
      grads_(backend, registry_, grads_config(config_.grads, groups_)),
      trace_(config_.trace_spans) {
  for (const GroupConfig& group : groups_) {
    CacheConfig cache = config_.cache;
    cache.budget_bytes = group.budget_bytes;
    cache.name = group.name;
    caches_.push_back(std::make_unique<Cache>(backend_, cache));
    // Without backend graphs every fill runs eagerly (the setting is inert, not an error, so one
    // profile serves every backend).
    fill_graphs_.push_back(std::make_unique<FillGraphs>(backend_, backend_.supports_graphs() ? group.fill_graphs : 0));
  }
  graphs_relocations_.resize(groups_.size());
  group_stats_.resize(groups_.size());
  by_group_.resize(groups_.size());
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

bool Runtime::registered(const ChainKey& key) const {
  return std::all_of(key.begin(), key.end(), [&](WeightId id) { return registry_.contains(id); });
}

std::vector<std::uint64_t> Runtime::versions(const ChainKey& key) const {
  std::vector<std::uint64_t> out;
  for (WeightId id : key) out.push_back(registry_.get(id).version);
  return out;
}

bool Runtime::kept_current(const ChainKey& key) const {
  const int group = group_of(key);
  if (!groups_[group].keep_gathered) return false;
  const int index = caches_[group]->find_kept(key);
  if (index < 0) return false;
  const std::vector<std::uint64_t>& kept = caches_[group]->slot(index).versions;
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (kept[i] != registry_.get(key.weights[i]).version) return false;
  }
  return true;
}

// Slot layout, per weight of the key: the G gathered chunks, then the output region (BF16 weight or
// GEMM-ready sections, Weight::gemm), sized for the larger of the two.
// A key fills on the gather stream of its first weight's group; a key that spans groups first joins
// the other groups' gather streams, where its chunks were packed.
Stream Runtime::fill_stream(const ChainKey& key) {
  return backend_.side_stream(registry_.get(key.front()).desc.group, Role::kGather);
}

void Runtime::fill_many(const Fill* fills, std::size_t n, const char* why) {
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  const int group = group_of(*fills[0].key);
  Cache& cache = *caches_[group];
  const Stream stream = cache.slot(fills[0].index).filler;
  std::vector<Stream>& joined = joined_scratch_;  // reused: no allocation per fill
  joined.assign(1, stream);
  std::string names;
  for (std::size_t f = 0; f < n; ++f) {
    for (WeightId id : *fills[f].key) {
      registry_.pack_if_pending(id);  // on its gather stream, which the fill stream joins below (or is)
      const Weight& w = registry_.get(id);
      if (id >= static_cast<WeightId>(weight_stats_.size())) weight_stats_.resize(id + 1);
      weight_stats_[id].gathered_bytes += w.geometry.group_size * w.layout.chunk_bytes;
      if (trace_.enabled()) names += (names.empty() ? "" : ",") + w.desc.name;
      const Stream gather = backend_.side_stream(w.desc.group, Role::kGather);
      if (std::find(joined.begin(), joined.end(), gather) != joined.end()) continue;
      joined.push_back(gather);
      backend_.order(stream, gather);
    }
  }
  FillGraphs& graphs = *fill_graphs_[group];
  if (graphs_relocations_[group] != cache.relocations()) {  // a slot moved: its graphs hold the old address
    graphs.clear();
    graphs_relocations_[group] = cache.relocations();
  }
  if (!graphs.enabled() || backend_.capturing(stream)) {  // a captured step records the work itself
    enqueue_fill(fills, n, stream);
  } else {
    // Rank-uniform: what the slots and keys are, never where they are (fill_graphs.h).
    std::vector<std::int64_t>& signature = signature_scratch_;
    signature.clear();
    for (std::size_t f = 0; f < n; ++f) {
      const ChainKey& key = *fills[f].key;
      signature.push_back(fills[f].index);
      signature.push_back(static_cast<std::int64_t>(key.layout));
      signature.push_back(static_cast<std::int64_t>(key.size()));
      signature.insert(signature.end(), key.begin(), key.end());
    }
    const FillGraphs::Ran ran = graphs.run(signature, stream, [&] { enqueue_fill(fills, n, stream); });
    GroupStats& counters = group_stats_[group];
    counters.graph_recordings += ran == FillGraphs::Ran::kRecorded ? 1 : 0;
    counters.graph_fills += ran == FillGraphs::Ran::kEager ? 0 : 1;
  }
  for (std::size_t f = 0; f < n; ++f) {
    Cache::Slot& slot = cache.slot(fills[f].index);
    slot.key = *fills[f].key;
    slot.versions = versions(slot.key);
    if (slot.ready != 0) backend_.forget(slot.ready);  // a prefetch that was dropped or re-gathered
    slot.ready = backend_.record(stream);
  }
  if (trace_.enabled()) trace_.add("gather " + names, why, start);
}

void Runtime::enqueue_fill(const Fill* fills, std::size_t n, Stream stream) {
  Cache& cache = *caches_[group_of(*fills[0].key)];
  // The keys' all-gathers go out as one batch (one NCCL group on the CUDA backend), then the unpacks:
  // nothing else may sit between them on the stream, because a batch launches at its end.
  {
    Backend::CollectiveBatch batch(backend_);
    for (std::size_t f = 0; f < n; ++f) {
      char* next = static_cast<char*>(cache.slot(fills[f].index).ptr);
      for (WeightId id : *fills[f].key) {
        const Weight& w = registry_.get(id);
        backend_.all_gather(stream, w.desc.group, w.send(), next, w.layout.chunk_bytes);
        next += w.geometry.group_size * w.layout.chunk_bytes + w.output_bytes;
      }
    }
    batch.launch();
  }
  // The GEMM layout is unpacked per weight; the BF16 layout in one unpack_many per wire spec over all
  // the keys (one kernel launch for up to kernels::kUnpackJobsPerLaunch weights on CUDA: an MoE expert
  // group is one key of many same-wire weights), the specs in the order the keys first name them.
  unpacks_scratch_.clear();
  for (std::size_t f = 0; f < n; ++f) {
    const ChainKey& key = *fills[f].key;
    char* next = static_cast<char*>(cache.slot(fills[f].index).ptr);
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
}

std::vector<Materialized> Runtime::outputs(int index, const ChainKey& key) {
  std::vector<Materialized> out;
  char* next = static_cast<char*>(caches_[group_of(key)]->slot(index).ptr);
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

void Runtime::join_capture(Stream stream) {
  if (!backend_.capturing(stream)) return;
  for (const GroupConfig& group : groups_) {
    if (group.keep_gathered) {
      throw std::invalid_argument(group.name + " keeps weights gathered (keep_gathered), which CUDA graph capture "
                                  "does not support: what a step gathers depends on what earlier steps kept; "
                                  "turn keep_gathered off for captured steps");
    }
  }
  // Replays gather without the eager fills that pack lazily: from now on every re-pack is done at once.
  registry_.pack_on_update();
  for (int g = 0; g < backend_.group_count(); ++g) {
    for (Role role : {Role::kGather, Role::kReduceScatter}) {
      const Stream side = backend_.side_stream(g, role);
      if (!backend_.capturing(side)) backend_.order(side, stream);
    }
  }
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
  const int group = group_of(key);
  Cache& cache = *caches_[group];
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
  if (kept) {
    if (index >= 0) cache.drop(index);
    index = cache.find_kept(key);
  }
  const bool hit = index >= 0;
  if (kept) {
    ++stats_.kept_hits;
    ++group_stats_[group].kept_hits;
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
    if (!kept) ++(hit ? w.prefetch_hits : w.exposed_gathers);
  }
  Cache::Slot& slot = cache.slot(index);
  slot.state = Cache::State::kHeld;
  slot.chain = -1;
  slot.position = -1;
  if (kept) {
    ++slot.consumers;
  } else {
    slot.consumers = 1;
    slot.keep = groups_[group].keep_gathered;
  }
  backend_.wait(stream, slot.ready);
  if (!slot.keep) {  // a kept slot keeps its fill's event for every later consumer to wait on
    backend_.forget(slot.ready);
    slot.ready = 0;
  }
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
                                (key.size() > 1 ? " and the others listed" : "") +
                                " are not materialized" + (layout ? " in the " + to_string(*layout) + " layout" : std::string()) +
                                " (a double release, or a release without materialize); "
                                "release exactly the ids passed to materialize, once");
  }
  join_capture(stream);
  cache.release(index, backend_.record(stream), stream);
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

void Runtime::unregister_weight(WeightId id) {
  const Weight& w = registry_.get(id);
  for (const std::unique_ptr<Cache>& cache : caches_) {
    for (int i = 0; i < cache->size(); ++i) {
      const Cache::Slot& slot = cache->slot(i);
      if (slot.state == Cache::State::kHeld && std::find(slot.key.begin(), slot.key.end(), id) != slot.key.end()) {
        throw std::invalid_argument("unregister: weight '" + w.desc.name + "' is materialized; release it first");
      }
    }
  }
  if (grads_.busy(id)) {
    throw std::invalid_argument("unregister: weight '" + w.desc.name +
                                "' has a grad buffer or a pending reduction; finalize and drain first");
  }
  registry_.remove(id);
  for (const std::unique_ptr<Cache>& cache : caches_) {
    for (int i = 0; i < cache->size(); ++i) {
      const Cache::Slot& slot = cache->slot(i);
      if ((slot.state == Cache::State::kPrefetched || slot.state == Cache::State::kKept) &&
          std::find(slot.key.begin(), slot.key.end(), id) != slot.key.end()) {
        cache->drop(i);
      }
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
  clear_schedule();
  schedule_position_ = 0;
  schedule_in_sync_ = false;
  schedule_rerecord_ = false;
  for (const std::unique_ptr<Cache>& cache : caches_) cache->drop_unheld();
  for (const std::unique_ptr<FillGraphs>& graphs : fill_graphs_) graphs->clear();
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

CacheStats Runtime::cache_stats() const {
  CacheStats sum;
  for (const std::unique_ptr<Cache>& cache : caches_) {
    const CacheStats& c = cache->stats();
    sum.slots += c.slots;
    sum.slot_bytes += c.slot_bytes;
    sum.peak_bytes += c.peak_bytes;
    sum.budget_waits += c.budget_waits;
    sum.evictions += c.evictions;
    sum.dropped_prefetches += c.dropped_prefetches;
    sum.kept_dropped += c.kept_dropped;
  }
  return sum;
}

GroupStats Runtime::group_stats(int group) const {
  if (group < 0 || group >= group_count()) {
    throw std::invalid_argument("group " + std::to_string(group) + " does not exist; the backend has groups 0.." +
                                std::to_string(group_count() - 1));
  }
  GroupStats out = group_stats_[group];
  out.config = groups_[group];
  out.cache = caches_[group]->stats();
  out.fill_graphs = fill_graphs_[group]->size();
  for (int i = 0; i < caches_[group]->size(); ++i) {
    const Cache::Slot& slot = caches_[group]->slot(i);
    out.prefetched += slot.state == Cache::State::kPrefetched ? 1 : 0;
    out.kept += slot.keep && (slot.state == Cache::State::kKept || slot.state == Cache::State::kHeld) ? 1 : 0;
  }
  return out;
}

std::string Runtime::stats_json() const {
  const RuntimeStats s = stats();
  const CacheStats c = cache_stats();
  const GradsStats& g = grads_.stats();
  const MemoryStats& m = backend_.memory();
  nlohmann::json j;
  j["backend"] = backend_.name();
  j["materialize"] = {{"calls", s.materializations}, {"prefetch_hits", s.prefetch_hits}, {"kept_hits", s.kept_hits},
                      {"exposed_gathers", s.exposed_gathers}, {"prefetches", s.prefetches},
                      {"prefetch_batches", s.prefetch_batches}, {"stale_prefetches", s.stale_prefetches}};
  j["chains"] = {{"mismatches", s.chain_mismatches}, {"last_mismatch", s.last_mismatch},
                 {"schedule_entries", schedule_.size()}, {"schedule_mismatches", s.schedule_mismatches}};
  j["cache"] = {{"slots", c.slots}, {"slot_bytes", c.slot_bytes}, {"budget_waits", c.budget_waits},
                {"evictions", c.evictions}, {"dropped_prefetches", c.dropped_prefetches},
                {"kept_dropped", c.kept_dropped}};
  nlohmann::json groups = nlohmann::json::array();
  for (int index = 0; index < group_count(); ++index) {
    const GroupStats group = group_stats(index);
    groups.push_back({{"group", index}, {"name", group.config.name}, {"depth", group.config.depth},
                      {"prefetch_batch", group.config.prefetch_batch},
                      {"keep_gathered", group.config.keep_gathered}, {"kept", group.kept},
                      {"fill_graphs_limit", group.config.fill_graphs}, {"fill_graphs", group.fill_graphs},
                      {"grads_into_main_grad", group.config.grads_into_main_grad},
                      {"graph_recordings", group.graph_recordings}, {"graph_fills", group.graph_fills},
                      {"kept_hits", group.kept_hits},
                      {"budget_bytes", group.config.budget_bytes}, {"slots", group.cache.slots},
                      {"slot_bytes", group.cache.slot_bytes}, {"peak_bytes", group.cache.peak_bytes},
                      {"budget_waits", group.cache.budget_waits}, {"evictions", group.cache.evictions},
                      {"materializations", group.materializations}, {"prefetch_hits", group.prefetch_hits},
                      {"exposed_gathers", group.exposed_gathers}, {"prefetches", group.prefetches},
                      {"prefetch_batches", group.prefetch_batches}, {"prefetched", group.prefetched}});
  }
  j["groups"] = groups;
  j["grads"] = {{"reduce_scatters", g.reduce_scatters}, {"into_main_grad", g.into_main_grad},
                {"grads_ready", g.grads_ready},
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

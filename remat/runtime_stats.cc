// The Runtime's figures: counters, per-group and per-weight stats, and stats_json.
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "remat/runtime.h"

namespace gtp::remat {

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
                      {"shared_hits", s.shared_hits},                       {"exposed_gathers", s.exposed_gathers}, {"prefetches", s.prefetches},
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
                      {"tag_checks", group.tag_checks}, {"kept_hits", group.kept_hits}, {"shared_hits", group.shared_hits},
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
                {"pool_buffers", g.pool_buffers}, {"zeroed_handouts", g.zeroed_handouts},
                {"zeroed_copies", g.zeroed_copies}};
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

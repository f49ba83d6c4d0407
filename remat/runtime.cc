// The Runtime's setup: per-group settings, key helpers, capture joins, unregister and chain reset.
#include "remat/runtime.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gtp::remat {
namespace {

constexpr int kPhases = 3;

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
  fill_tag_check_ = [this](int group, const FillTag* tags, int count, const char* when) {
    if (!config_.check_every_fill) {
      std::string why = "the step's check at drain, over every gather since the previous one";
      if (when != nullptr) why += std::string("; ") + when;
      return check_fill_tags(group, tags, count, why.c_str());
    }
    const std::string why = std::string(fill_why_) == "exposed" ? "on demand" : fill_why_;  // the trace's words
    check_fill_tags(group, tags, count, when != nullptr ? when : why.c_str());
  };
  step_tags_.resize(groups_.size());
  group_gathered_.resize(groups_.size(), 0);
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
  grads_.drop_declaration(id);
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

}  // namespace gtp::remat

// remat::Runtime: the registry, the lifetime-tracked cache, the verified prefetch chains and the
// gradient path behind one object, on any Backend. This is what the C ABI wraps. See docs/remat.md.
//
// Collective contract: the ranks of a group make the same calls that involve the group (register
// order aside) in the same order with the same configuration, so that gathers, prefetches and
// reductions line up. One thread at a time per Runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/cache.h"
#include "remat/chain.h"
#include "remat/grads.h"
#include "remat/registry.h"
#include "remat/stats.h"

namespace gtp::remat {

// How materialized weights are laid out. BF16: [rows, cols] row-major, padding stripped, decoded from
// the wire chunks (bit-identical to the unsharded BF16 weight on the BF16 wire).
enum class Layout { kBF16 };

struct RuntimeConfig {
  int depth = 1;  // chain entries prefetched ahead of the consumer, 0 (no prefetch, as profiles allow)..kMaxDepth
  CacheConfig cache;
  GradsConfig grads;
  std::size_t trace_spans = 0;  // spans kept for chrome_trace(); 0: no trace
};
inline constexpr int kMaxDepth = 64;

struct RuntimeStats {
  std::int64_t materializations = 0;
  std::int64_t prefetch_hits = 0;       // served from a slot gathered ahead
  std::int64_t exposed_gathers = 0;     // gathered on demand (recording, mismatch, budget, first use)
  std::int64_t prefetches = 0;          // gathers issued ahead of their consumer
  std::int64_t stale_prefetches = 0;    // prefetched weights re-packed before use: dropped, re-gathered
  std::int64_t chain_mismatches = 0;    // over all chains
  std::string last_mismatch;
};

class Runtime {
 public:
  Runtime(Backend& backend, RuntimeConfig config);
  ~Runtime() = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Registry& registry() const { return registry_; }
  WeightId register_weight(const WeightDesc& desc) { return registry_.add(desc); }
  // Refused (std::invalid_argument) while the weight is materialized or has gradients in flight.
  void unregister_weight(WeightId id);
  // Collective re-pack (Registry::shard_updated); prefetched copies of these weights are re-gathered.
  void shard_updated(const WeightId* ids, std::int64_t n);

  // The full weights of `ids` (leaders expanded into their experts), one pointer per expanded weight,
  // usable on `stream` once its earlier work is done. `chunk` selects the model chunk (VPP) chain.
  std::vector<void*> materialize(const WeightId* ids, std::int64_t n, Phase phase, int chunk, Layout layout,
                                 Stream stream);
  // Ends this consumer's use (after its work on `stream`). The ids must be those of an outstanding
  // materialize; anything else (double release, release without materialize) is std::invalid_argument.
  void release(const WeightId* ids, std::int64_t n, Stream stream);

  float* grad_buffer(WeightId id, Stream stream);
  void finalize(const WeightId* ids, std::int64_t n, bool last_microbatch, Stream stream);
  // End-of-backward fence: pending main-grad adds are applied, `stream` is ordered after everything,
  // and every chain ends its step (the first drain closes recording). Under CUDA graph capture the
  // next step's head prefetch is joined into `stream` too, and the step must end with the cache state
  // it began with (std::invalid_argument otherwise): see docs/remat.md, CUDA graphs.
  void drain(Stream stream);
  // Forgets every chain (in-process model rebuild) and drops prefetched slots.
  void reset_chains();

  RuntimeStats stats() const;
  const CacheStats& cache_stats() const { return cache_.stats(); }
  const GradsStats& grads_stats() const { return grads_.stats(); }
  // Per-weight figures (WeightStats{} for a weight never materialized).
  WeightStats weight_stats(WeightId id) const;
  // Counters, cache, grads, memory and per-weight figures.
  std::string stats_json() const;
  // The latest trace_spans spans as a Chrome trace (chrome://tracing, Perfetto); `pid` labels the rank.
  std::string chrome_trace(int pid) const { return trace_.chrome_json(pid); }

 private:
  int chain_index(Phase phase, int chunk);
  std::int64_t bytes_for(const ChainKey& key) const;
  std::vector<std::uint64_t> versions(const ChainKey& key) const;
  // Gathers and unpacks `key` into the slot; `why` is the trace category.
  void fill(int slot, const ChainKey& key, const char* why);
  std::vector<void*> outputs(int slot, const ChainKey& key);
  void refill(int chain);
  // Under CUDA graph capture of `stream`, forks the side stream into the capture (once per capture).
  void join_capture(Stream stream);
  // (slot, chain, position) of every prefetched slot: the state a captured step must end in.
  std::vector<std::int64_t> boundary() const;

  Backend& backend_;
  RuntimeConfig config_;
  Registry registry_;
  Cache cache_;
  Grads grads_;
  std::vector<Chain> chains_;       // index = chunk * 3 + phase
  int active_chain_ = -1;           // the chain of the latest materialize, refilled on release
  RuntimeStats stats_;
  std::vector<WeightStats> weight_stats_;  // indexed by id
  Trace trace_;
  std::vector<std::int64_t> boundary_;  // boundary() after the latest drain
};

}  // namespace gtp::remat

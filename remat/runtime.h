// remat::Runtime: the registry, the lifetime-tracked cache, the verified prefetch chains and the
// gradient path behind one object, on any Backend. This is what the C ABI wraps. See docs/remat.md.
//
// Collective contract: the ranks of a group make the same calls that involve the group (register
// order aside) in the same order with the same configuration, so that gathers, prefetches and
// reductions line up. One thread at a time per Runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/cache.h"
#include "remat/chain.h"
#include "remat/fill_graphs.h"
#include "remat/grads.h"
#include "remat/registry.h"
#include "remat/stats.h"

namespace gtp::remat {

// One materialized weight (Layout is in chain.h). Pointers are backend memory inside the slot, valid
// until the consumer's release. BF16 layout (and the GEMM layout of the BF16 wire): `data` is the BF16
// weight [rows, cols], the rest null / 0. GEMM layout (FP8, MXFP8, NVFP4, sizes in `gemm`):
// `data` [gemm_rows, cols] codes (NVFP4 two per byte); `scales` MXFP8 [gemm_rows, cols/32] E8M0,
// NVFP4 1D [gemm_rows, cols/16] and 2D [gemm_rows/16, cols/16] E4M3 (null for FP8);
// `transposed_data` FP8 [cols, gemm_rows], NVFP4 2D [cols, gemm_rows/2] (null for MXFP8 and NVFP4 1D);
// `transposed_scales` NVFP4 2D [cols/16, gemm_rows/16]; `decode_scales` FP8 / NVFP4 one FP32 per
// chunk (gemm.decode_scale_count = G; equal when pack used the shared amax, as the registry does).
struct Materialized {
  Layout layout = Layout::kBF16;  // the layout actually produced (kBF16 for GEMM of the BF16 wire)
  kernels::WireSpec wire;
  std::int64_t rows = 0, cols = 0;
  std::int64_t shard_rows = 0;  // rows per wire chunk: decode_scales[g] covers [g, g + 1) x shard_rows
  void* data = nullptr;
  void* scales = nullptr;
  void* transposed_data = nullptr;
  void* transposed_scales = nullptr;
  const float* decode_scales = nullptr;
  kernels::GemmLayoutSizes gemm;  // all zero for the BF16 layout
};

// One backend group's prefetch and cache (index = WeightDesc::group; a key belongs to the group of
// its first weight). See docs/remat.md, Per-group depth and budget.
struct GroupConfig {
  int depth = 1;                  // keys of this group prefetched ahead, 0 (always on demand)..kMaxDepth
  std::int64_t budget_bytes = 0;  // cap on the bytes of this group's cache slots; 0: no limit
  std::string name;               // in messages and stats; empty: "group <index>"
  // The group's due prefetches wait until this many are due (1..max(depth, 1)), then go out together:
  // one collective batch (one NCCL group launch on the CUDA backend) and one unpack launch per wire,
  // instead of one of each per key. A prefetch whose consume is next never waits. Trades lead time
  // (each key is gathered depth - batch + 1 to depth consumes ahead) for host and launch overhead.
  int prefetch_batch = 1;
  // Materialized weights stay gathered after their release, in their slots, until their shards change
  // (shard_updated), the chains reset, or the budget needs the room; a later materialize of the same
  // weights in the same layout (the backward after the forward, the next microbatch) is served from
  // there without a gather. Trades memory (up to every key of the group at once) for gathers, like
  // FSDP's reshard_after_forward=False. Not under CUDA graph capture.
  bool keep_gathered = false;
  // The most fills of this group kept as backend graphs; 0: none. Each distinct fill (the same keys
  // into the same slots) is recorded once and then launched as one graph: on CUDA one cudaGraphLaunch
  // instead of an all-gather and unpack launches per fill. Fills past the limit run eagerly. Worth it
  // where host time per call matters (small weights, one weight per call); docs/remat.md, Fill graphs.
  std::int64_t fill_graphs = 0;
  // On a size-1 group the reduce-scatter is the identity: a grad buffer asked for with
  // GradInit::kUndefined is then the weight's main grad itself (add into it) and finalize moves
  // nothing. false keeps the full-size buffer, its (no-op) reduce-scatter and the deferred add, as on
  // larger groups. Inert on groups of more than one rank. docs/remat.md, Gradients.
  bool grads_into_main_grad = true;
};

struct RuntimeConfig {
  // With `groups` empty, every group gets `depth` and `cache.budget_bytes` (each group its own
  // budget of that size, not a share of it).
  int depth = 1;  // 0 (no prefetch, as profiles allow)..kMaxDepth
  int prefetch_batch = 1;  // every group's GroupConfig::prefetch_batch when `groups` is empty
  bool keep_gathered = false;  // every group's GroupConfig::keep_gathered when `groups` is empty
  std::int64_t fill_graphs = 0;  // every group's GroupConfig::fill_graphs when `groups` is empty
  bool grads_into_main_grad = true;  // every group's GroupConfig::grads_into_main_grad when `groups` is empty
  CacheConfig cache;
  std::vector<GroupConfig> groups;  // empty, or one entry per backend group
  GradsConfig grads;
  std::size_t trace_spans = 0;  // spans kept for chrome_trace(); 0: no trace
  // Ranks that disagree (docs/reliability.md): false checks every group of G > 1 once per step, at
  // drain, over every gather since the previous check (one 64-byte tag collective per group and step;
  // a fill is its data's collectives alone). true checks each fill before it is unpacked (a tag
  // collective beside every fill's): the debugging setting, which poisons the diverging fill's output.
  bool check_every_fill = false;
};
inline constexpr int kMaxDepth = 64;

struct RuntimeStats {
  std::int64_t materializations = 0;
  std::int64_t prefetch_hits = 0;       // served from a slot gathered ahead
  std::int64_t kept_hits = 0;           // served from a slot kept gathered (GroupConfig::keep_gathered)
  std::int64_t shared_hits = 0;         // served from the slot of a use not yet released (the same key)
  std::int64_t exposed_gathers = 0;     // gathered on demand (recording, mismatch, budget, first use)
  std::int64_t prefetches = 0;          // gathers issued ahead of their consumer
  std::int64_t prefetch_batches = 0;    // times prefetches went out (prefetches / this: keys per batch)
  std::int64_t stale_prefetches = 0;    // prefetched weights re-packed before use: dropped, re-gathered
  std::int64_t chain_mismatches = 0;    // over all chains
  std::string last_mismatch;
  std::int64_t schedule_mismatches = 0;  // consumes that left the recorded cross-chain schedule
};

// One group's settings as applied, its materialize counters and its cache's figures.
struct GroupStats {
  GroupConfig config;  // name filled in
  std::int64_t materializations = 0;
  std::int64_t prefetch_hits = 0;
  std::int64_t kept_hits = 0;
  std::int64_t shared_hits = 0;
  std::int64_t exposed_gathers = 0;
  std::int64_t prefetches = 0;
  std::int64_t prefetch_batches = 0;
  std::int64_t prefetched = 0;  // slots prefetched now (at most config.depth)
  std::int64_t kept = 0;        // slots kept gathered now (Kept, or Held and kept after release)
  std::int64_t fill_graphs = 0;       // graphs held now (at most config.fill_graphs)
  std::int64_t graph_recordings = 0;  // fills recorded into a new graph
  std::int64_t graph_fills = 0;       // fills run as a graph launch (recordings included)
  std::int64_t tag_checks = 0;        // divergence checks issued: one per fill, or one per step-ending drain
  CacheStats cache;
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
  // Collective re-pack (Registry::shard_updated) after the optimizer's work on `stream`; prefetched
  // copies of these weights are re-gathered.
  void shard_updated(const WeightId* ids, std::int64_t n, Stream stream);

  // The full weights of `ids` (leaders expanded into their experts) in `layout`, one entry per
  // expanded weight, usable on `stream` once its earlier work is done. `chunk` selects the model chunk
  // (VPP) chain. The same weights in another layout are another key: their own slot and chain entry.
  std::vector<Materialized> materialize_views(const WeightId* ids, std::int64_t n, Phase phase, int chunk,
                                              Layout layout, Stream stream);
  // materialize_views reduced to each weight's `data` pointer (the BF16 weight in Layout::kBF16).
  std::vector<void*> materialize(const WeightId* ids, std::int64_t n, Phase phase, int chunk, Layout layout,
                                 Stream stream);
  // Ends this consumer's use (after its work on `stream`). The ids must be those of an outstanding
  // materialize; anything else (double release, release without materialize) is std::invalid_argument.
  // Without `layout`, the weights must be held in one layout only (else std::invalid_argument: name it).
  void release(const WeightId* ids, std::int64_t n, Stream stream, std::optional<Layout> layout = std::nullopt);

  // Grads::buffer: with GradInit::kUndefined the consumer writes its first wgrad when `overwrite`.
  GradBuffer grad_buffer(WeightId id, Stream stream, GradInit init = GradInit::kZero);
  void finalize(const WeightId* ids, std::int64_t n, bool last_microbatch, Stream stream);
  // Grads::declare_zeroed for `ids` (leaders with their experts); n = 0: every weight with a main grad.
  // A grad_buffer under CUDA graph capture drops the weight's declaration (docs/remat.md, Grads).
  void main_grads_zeroed(const WeightId* ids, std::int64_t n);
  // End-of-backward fence: pending main-grad adds are applied, `stream` is ordered after everything,
  // and every chain ends its step (the first drain closes recording). Under CUDA graph capture the
  // next step's head prefetch is joined into `stream` too, and the step must end with the cache state
  // it began with (std::invalid_argument otherwise): see docs/remat.md, CUDA graphs.
  //
  // `head`: kAtDrain prefetches the next step's head here. kAfterShardUpdate defers it to the next
  // shard_updated, after the re-pack, for the usual flow drain -> optimizer step -> shard_updated,
  // where a head gathered at drain would be gathered again from the new shards (stale_prefetches);
  // a materialize or reset_chains before that shard_updated cancels the deferral (the head is then
  // gathered on demand). Not under CUDA graph capture (std::invalid_argument).
  // `step_ends` false: more backward passes follow before the optimizer step (gradient accumulation),
  // so the per-step divergence check waits for the drain that ends the step; it covers every gather
  // since the previous check either way.
  enum class Head { kAtDrain, kAfterShardUpdate };
  void drain(Stream stream, Head head = Head::kAtDrain, bool step_ends = true);
  // Forgets every chain (in-process model rebuild), drops prefetched slots and fill graphs. Collective
  // (the next fills are those of a new recording).
  void reset_chains();
  // True while `stream` is being captured into a CUDA graph, or a capture has joined any side stream
  // (every runtime call under capture forks them in, and drain joins them back before the capture can
  // end). Calls that allocate, free or re-pack must not run then (the C ABI refuses them).
  bool capture_in_progress(Stream stream);

  RuntimeStats stats() const;
  // Summed over the groups' caches (peak_bytes: the sum of their peaks).
  CacheStats cache_stats() const;
  int group_count() const { return static_cast<int>(groups_.size()); }
  // Throws std::invalid_argument for a group the backend does not have.
  GroupStats group_stats(int group) const;
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
  Stream fill_stream(const ChainKey& key);
  std::vector<std::uint64_t> versions(const ChainKey& key) const;
  // True when the key's group keeps weights gathered and a slot holds the key at its current versions.
  bool kept_current(const ChainKey& key) const;
  // The key of a schedule entry, or null when its chain was reset or a weight unregistered since.
  const ChainKey* schedule_key(std::int64_t entry) const;
  // The group whose cache, depth and budget a key uses: its first weight's.
  int group_of(const ChainKey& key) const { return registry_.get(key.front()).desc.group; }
  bool registered(const ChainKey& key) const;
  // A key to gather into slot `index` of its group's cache.
  struct Fill {
    int index;
    const ChainKey* key;
  };
  // Gathers and unpacks keys into their slots: every key's all-gathers in one collective batch, then
  // the unpacks (one launch per wire spec for the BF16 layout). All keys fill on one stream: keys of
  // one group. `why` is the trace category.
  void fill_many(const Fill* fills, std::size_t n, const char* why);
  // fill_many's work on `stream` (the collective batch, then the unpacks), eagerly or into a graph.
  void enqueue_fill(const Fill* fills, std::size_t n, Stream stream);
  void fill(int slot, const ChainKey& key, const char* why) {
    const Fill one{slot, &key};
    fill_many(&one, 1, why);
  }
  // Takes a slot of the key's group for a prefetch of (chain, position) and fills it; false when the
  // group's budget defers it.
  bool prefetch(int group, const ChainKey& key, int chain, std::int64_t position);
  std::vector<Materialized> outputs(int slot, const ChainKey& key);  // slot of the key's group
  // What this rank gathers in a fill, and the check of every rank's (runtime_agree.cc): throws
  // DivergenceError naming the differing ranks, their weights and `fill_why_`.
  FillTag fill_tag(const Fill* fills, std::size_t n) const;
  void check_fill_tags(int group, const FillTag* tags, int count, const char* when) const;
  // What a group gathered since its last check (check_every_fill false): a running FillTag over
  // every weight of every fill, in order.
  struct StepTag {
    Fingerprint weights, versions;
    FillTag tag;
  };
  void add_to_tag(const Fill* fills, std::size_t n, StepTag& into) const;
  // drain's check (check_every_fill false): per group of G > 1, one tag collective over its StepTag.
  void check_step();
  void refill(int chain);
  // Per group g, prefetches the next depth_g entries of group g in the recorded step schedule.
  void refill_schedule();
  // Follows a consume of (chain, position) of a key of `group` through the step schedule (recording
  // on the first step).
  void follow_schedule(int chain, std::int64_t position, int group);
  void clear_schedule();
  // Under CUDA graph capture of `stream`, forks every side stream into the capture (once per capture).
  void join_capture(Stream stream);
  // (group, slot, chain, position) of every prefetched slot: the state a captured step must end in.
  std::vector<std::int64_t> boundary() const;

  Backend& backend_;
  RuntimeConfig config_;
  std::vector<GroupConfig> groups_;  // per backend group, as applied
  Registry registry_;
  std::vector<std::unique_ptr<Cache>> caches_;  // per group: slots sized for that group's keys
  std::vector<std::unique_ptr<FillGraphs>> fill_graphs_;  // per group
  std::vector<std::uint64_t> graphs_relocations_;  // per group: its cache's relocations its graphs saw
  std::vector<std::int64_t> signature_scratch_;   // a fill's signature, reused
  Grads grads_;
  std::vector<Chain> chains_;       // index = chunk * 3 + phase
  int active_chain_ = -1;           // the chain of the latest materialize, refilled on release
  // The step schedule: every consume of the first step as (chain, position), in call order, so that
  // prefetch looks ahead across chain switches (forward -> backward of a microbatch, recompute,
  // VPP chunks) instead of only along the active chain. Verified like a chain; while a step follows
  // it (`schedule_in_sync_`) the prefetch window of group g is its next depth_g entries of group g,
  // else the active chain's.
  std::vector<std::pair<int, std::int64_t>> schedule_;
  std::vector<int> schedule_group_;                    // the group of each schedule entry
  std::vector<std::vector<std::int64_t>> by_group_;    // per group, its schedule indices in order
  bool schedule_recording_ = true;
  std::int64_t schedule_position_ = 0;
  bool schedule_in_sync_ = false;
  std::int64_t schedule_mismatches_ = 0;
  bool schedule_rerecord_ = false;  // a chain recorded after the schedule closed: record it again
  RuntimeStats stats_;
  std::vector<GroupStats> group_stats_;  // counters only; config and cache filled in by group_stats()
  std::vector<WeightStats> weight_stats_;  // indexed by id
  Trace trace_;
  std::vector<std::int64_t> boundary_;  // boundary() after the latest drain
  bool head_deferred_ = false;          // drain(.., kAfterShardUpdate): shard_updated prefetches the head
  std::vector<Stream> joined_scratch_;  // fill()'s gather streams joined so far
  // refill's windows (schedule indices, or chain positions), per-group counts and deferred groups:
  // reused, so a refill allocates nothing in steady state.
  std::vector<std::int64_t> window_scratch_;
  std::vector<int> window_group_scratch_;
  std::vector<int> count_scratch_;
  std::vector<char> deferred_scratch_;
  // refill_schedule's due prefetches (schedule indices), the groups in the order of their first due
  // consume, and one group's takes: reused likewise.
  std::vector<std::int64_t> due_scratch_;
  std::vector<int> group_order_scratch_;
  std::vector<char> window_ends_scratch_;  // per group: its window reaches the end of its schedule
  std::vector<Fill> fills_scratch_;
  // fill()'s BF16-layout unpacks with their wire specs, the distinct specs, and one spec's jobs:
  // reused, so a steady-state fill allocates nothing.
  std::vector<std::pair<kernels::WireSpec, kernels::UnpackJob>> unpacks_scratch_;
  std::vector<kernels::WireSpec> unpack_specs_scratch_;
  std::vector<kernels::UnpackJob> unpack_jobs_scratch_;
  Backend::FillTagCheck fill_tag_check_;  // calls check_fill_tags; lives as long as the fill graphs
  const char* fill_why_ = "";             // the fill in progress: "exposed" or "prefetch"
  std::vector<StepTag> step_tags_;        // per group, while check_every_fill is false
  // Per group: it has gathered since the runtime began, so every drain checks it. Rank-uniform unless
  // the ranks already diverged in a way that hangs: a fill in a group that a peer never fills.
  std::vector<char> group_gathered_;
};

}  // namespace gtp::remat

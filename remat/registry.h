// Registry: the weights the runtime materializes. Each rank registers its own shard of every weight
// (rows group_rank x shard_rows ... of the TP-local weight, padding rows excluded) and keeps one packed
// wire chunk per weight. shard_updated() (once per optimizer step) reduces the amax and marks the
// chunks stale; each is packed right before its first gather (pack_if_pending), so the packs spread
// over the step in gather order instead of queueing, all of them, ahead of its first gathers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/wire_format.h"
#include "remat/backend.h"

namespace gtp::remat {

using WeightId = std::int64_t;
inline constexpr WeightId kNoWeight = -1;

struct WeightDesc {
  std::string name;                     // for messages and stats
  const void* shard = nullptr;          // valid_rows x cols of `dtype`, backend memory; null when
                                        // this rank holds only padding rows
  kernels::SourceDtype dtype = kernels::SourceDtype::kBF16;
  std::int64_t rows = 0;                // logical rows of the TP-local weight (out_features / TP)
  std::int64_t cols = 0;
  kernels::WireSpec wire;
  int group = 0;                        // the backend group the weight is sharded over (size G)
  float* main_grad = nullptr;           // FP32 valid_rows x cols, or null (no gradient)
  WeightId expert_leader = kNoWeight;   // set on every expert but the first: the group's first weight
  // How the GEMM layout stores block scales (MXFP8, NVFP4): row-major, or cuBLASLt's blocked 128x4.
  kernels::ScaleLayout gemm_scales = kernels::ScaleLayout::kRowMajor;
};

// Where the GEMM-ready outputs of one weight sit in its output region (byte offsets from the region's
// start, each section on kSectionAlignment). BF16 wire: no sections (its GEMM layout is the BF16 weight).
struct GemmPlacement {
  kernels::GemmLayoutSizes sizes;
  std::int64_t data = 0, scales = 0, transposed_data = 0, transposed_scales = 0, decode_scales = 0;
  std::int64_t bytes = 0;  // the whole GEMM output region
};
GemmPlacement gemm_placement(const kernels::WireSpec& spec, const kernels::WeightGeometry& geometry,
                             kernels::ScaleLayout scale_layout = kernels::ScaleLayout::kRowMajor);

struct Weight {
  WeightDesc desc;
  kernels::WeightGeometry geometry;
  kernels::ChunkLayout layout;
  std::int64_t valid_rows = 0;          // rows of this rank's shard
  GemmPlacement gemm;                   // the GEMM-ready layout within the output region
  // BF16 wire whose gathered chunks are the padded rows back to back: the gathered bytes ARE the
  // weight (its first rows x cols), so the gather writes it in place and nothing unpacks it.
  bool gathers_in_place = false;
  // Also a BF16 shard of which this rank holds every row (no padding): the shard is sent as it is, so
  // the weight has no chunk of its own and a re-pack only advances `version`. Gathers then read the
  // shard itself: the caller writes it only between drain and shard_updated (docs/remat.md).
  bool sends_from_shard = false;
  // The output region of a slot: the larger of the BF16 weight (rows x cols x 2) and the GEMM layout,
  // rounded to kSectionAlignment, so any slot serves either layout of the weight; 0 when
  // gathers_in_place.
  std::int64_t output_bytes = 0;
  void* chunk = nullptr;                // this rank's packed wire chunk (layout.chunk_bytes); null when
                                        // sends_from_shard
  std::uint64_t version = 0;            // shard updates so far; 0: never packed
  bool pack_pending = false;            // the chunk is older than `version`: pack before gathering
  // FP8, NVFP4: the weight's slot (an index) in its group's amax array (Registry::amax_of), fixed while
  // it is registered; -1 for wires that need no tensor amax.
  std::int64_t amax_slot = -1;
  std::vector<WeightId> members;        // a leader's experts after itself, in registration order
  // Its registration in its group on this rank (0, 1, ... counting unregistered weights too), and the
  // identity every rank of the group must agree on: Fingerprint of name, rows, cols, wire, group,
  // ordinal, amax slot and leader's ordinal. Gathers check it (FillTag; docs/reliability.md).
  std::int64_t ordinal = 0;
  std::uint64_t tag = 0;

  // What this rank sends when the weight is gathered (layout.chunk_bytes).
  const void* send() const { return sends_from_shard ? desc.shard : chunk; }
};

class Registry {
 public:
  explicit Registry(Backend& backend) : backend_(backend) {}
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Checks everything (shapes via weight_geometry, group, leader compatibility) before allocating the
  // chunk; throws std::invalid_argument naming the bad value and the fix.
  WeightId add(const WeightDesc& desc);
  // A leader can only go after its experts.
  void remove(WeightId id);

  // Throws std::invalid_argument for an id that is not registered.
  const Weight& get(WeightId id) const;
  bool contains(WeightId id) const;
  // Every registered weight, in id order.
  std::vector<WeightId> ids() const;

  // Leaders expand into themselves followed by their experts; others stay as they are.
  std::vector<WeightId> expand(const WeightId* ids, std::int64_t n) const;

  // The shards of `ids` (leaders: with their experts) changed: their versions advance and their chunks
  // are re-packed, by pack_if_pending before their next gather (or here, with pack_on_update). FP8 and
  // NVFP4 encode with the tensor amax over the whole weight: every local amax is reduced here, in one
  // all_reduce_max per group. Collective: every rank of each group involved calls it with the same ids
  // in the same order. The shards are read after the work enqueued so far on `stream` (the
  // optimizer's), and after every side stream's work: an in-flight reduce-scatter or a gather of
  // another group still reading a chunk is never overtaken.
  void shard_updated(const WeightId* ids, std::int64_t n, Stream stream);
  // The weight's reduced tensor amax (backend memory) that its packs read; null for wires without one.
  // Each weight has its own slot while it is registered, so a pack enqueued later (lazily, or captured
  // into a CUDA graph and replayed) reads this weight's latest amax whatever other weights were updated
  // since, and in whatever order. The address moves only when add() grows the group's array.
  const float* amax_of(WeightId id) const;
  // Enqueues the weight's pending pack on its group's gather stream (nothing when it is current).
  void pack_if_pending(WeightId id);
  // From now on shard_updated packs every chunk at once (a captured step's replays gather chunks that
  // no eager fill packs; docs/remat.md, CUDA graphs).
  void pack_on_update() { pack_on_update_ = true; }

 private:
  // One group's amax values, a float per weight that needs one, contiguous so that a group's
  // reduction is one all_reduce_max over the span of the updated weights' slots (the other slots in
  // the span hold already-reduced values, which a max over ranks leaves as they are).
  struct AmaxArray {
    float* values = nullptr;  // backend memory
    std::int64_t capacity = 0;
    std::int64_t used = 0;              // slots handed out so far (the next new one)
    std::vector<std::int64_t> free;     // slots of unregistered weights, reused first
  };
  Weight& at(WeightId id);
  Stream gather_stream(const Weight& weight) const;
  void pack(Weight& weight);
  std::int64_t take_amax_slot(int group);

  Backend& backend_;
  std::vector<Weight> weights_;   // indexed by id; removed weights keep their slot with chunk == null
  std::vector<bool> live_;
  std::map<int, AmaxArray> amax_;  // by group
  std::map<int, std::int64_t> registered_;  // by group: registrations so far (the next ordinal)
  bool pack_on_update_ = false;
};

}  // namespace gtp::remat

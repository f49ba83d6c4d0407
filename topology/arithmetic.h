// GTP arithmetic: derived sizes, validation, data ranks and shard padding.
//
// tensor_parallel_num_weight_shards = TP x G, so G (gtp_weight_remat_size) = shards / TP; the expert
// side is independent: expert_tensor_parallel_num_weight_shards = ETP x EG. GTP peers read DIFFERENT
// microbatches, so data is spread over DP x G while DP itself is only the replicate degree.
#pragma once

#include <cstdint>
#include <string>

#include "topology/grid.h"

namespace gtp::topology {

// What the user sets. A num_weight_shards of 0 means "not set": it defaults to TP (GTP off).
struct ParallelConfig {
  int world_size = 1;
  int tensor_model_parallel_size = 1;
  int context_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 0;  // 0: same as tensor_model_parallel_size (Megatron's default)
  int tensor_parallel_num_weight_shards = 0;
  int expert_tensor_parallel_num_weight_shards = 0;
};

// Everything derived from a valid ParallelConfig.
struct ParallelSizes {
  int world_size = 1;
  int tp = 1, gtp_remat = 1, cp = 1, dp = 1, pp = 1;                // dense grid
  int expt_tp = 1, ep = 1, expt_gtp_remat = 1, expt_dp = 1;         // expert grid (shares pp)
  int tensor_parallel_num_weight_shards = 1;
  int expert_tensor_parallel_num_weight_shards = 1;

  int gtp_weight_remat_size() const { return gtp_remat; }
  int expert_gtp_weight_remat_size() const { return expt_gtp_remat; }
  bool gtp_active() const { return gtp_remat > 1 || expt_gtp_remat > 1; }
  // Ranks that read distinct data: DP x G (CP ranks share a sample, they split its sequence).
  int data_ranks() const { return dp * gtp_remat; }
};

// Applies every rule (sizes >= 1, shards >= TP, shards % TP == 0, world divisible by
// TP*G*CP*PP and by ETP*EP*EG*PP); throws std::invalid_argument naming the value and the fix.
ParallelSizes derive_sizes(const ParallelConfig& config);

// shards / tp, after checking shards >= tp and shards % tp == 0. `what` names the knob in messages.
int derive_remat_size(int num_weight_shards, int tp, const std::string& shards_name, const std::string& tp_name);

// Dense grid tp, gtp_remat, cp, dp, pp (Megatron order tp-gtp_remat-cp-ep-dp-pp; the dense ep axis is
// size 1 and therefore omitted) plus the "expert" view expt_tp, ep, expt_gtp_remat, expt_dp, pp
// sharing pp, over ranks [rank_offset, rank_offset + world_size).
HyperCommGrid make_gtp_grid(const ParallelSizes& sizes, int rank_offset = 0);
inline constexpr const char* kExpertView = "expert";

// A rank's place among the ranks that read distinct data, for batch/sample/scheduler accounting.
struct DataParallelRank {
  int index = 0;  // position in the rank's gtp_remat x dp group: gtp_remat + G * dp
  int count = 1;  // DP x G
};
DataParallelRank data_parallel_rank(const ParallelSizes& sizes, int rank);

struct BatchAccounting {
  int64_t num_microbatches = 1;   // per data rank per step
  int64_t samples_per_step = 1;   // == global batch size
};
// global_batch must be a multiple of micro_batch x DP x G (Megatron's rule with GTP).
BatchAccounting batch_accounting(const ParallelSizes& sizes, int64_t global_batch_size, int64_t micro_batch_size);

enum class WireFormat { kBf16, kFp8, kMxfp8, kNvfp4 };
WireFormat parse_wire_format(const std::string& name);  // "bf16", "fp8", "mxfp8", "nvfp4"
const char* to_string(WireFormat format);
// Rows every shard must be a multiple of: 32 for MXFP8 (32-element scale blocks), 16 otherwise.
int alignment_rows(WireFormat format);

struct ShardPadding {
  int64_t rows = 0;         // TP-local rows before padding
  int64_t padded_rows = 0;  // rounded up to alignment x G
  int64_t pad_rows = 0;     // padded_rows - rows, at the tail of the gathered tensor
  int64_t shard_rows = 0;   // padded_rows / G, what each gtp_remat rank owns
};
// Pads the TP-LOCAL dim 0 (for column-parallel layers: out_features / TP, not out_features).
ShardPadding shard_padding(int64_t tp_local_rows, int gtp_remat, WireFormat format);

}  // namespace gtp::topology

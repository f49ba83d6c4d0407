#include "topology/arithmetic.h"

#include <stdexcept>

namespace gtp::topology {
namespace {

std::string str(long long value) { return std::to_string(value); }

void require_positive(const char* name, long long value) {
  if (value < 1) throw std::invalid_argument(std::string(name) + "=" + str(value) + " is invalid: it must be >= 1");
}

// world must split evenly into blocks of `product`; `factors` spells the product out for the message.
void require_divides(int world_size, long long product, const std::string& factors) {
  if (product > world_size || world_size % product != 0) {
    throw std::invalid_argument("world_size=" + str(world_size) + " is not divisible by " + factors + " = " +
                                str(product) + ": use a world size that is a multiple of " + str(product) +
                                " or reduce those sizes");
  }
}

}  // namespace

int derive_remat_size(int num_weight_shards, int tp, const std::string& shards_name, const std::string& tp_name) {
  if (num_weight_shards < tp) {
    throw std::invalid_argument(shards_name + "=" + str(num_weight_shards) + " is smaller than " + tp_name + "=" +
                                str(tp) + ": it counts TP x G shards, so use " + str(tp) +
                                " (GTP off) or a multiple of " + str(tp));
  }
  if (num_weight_shards % tp != 0) {
    throw std::invalid_argument(shards_name + "=" + str(num_weight_shards) + " is not divisible by " + tp_name + "=" +
                                str(tp) + ": choose a multiple of " + str(tp) + " (e.g. " +
                                str((num_weight_shards / tp + 1) * static_cast<long long>(tp)) + ")");
  }
  return num_weight_shards / tp;
}

ParallelSizes derive_sizes(const ParallelConfig& config) {
  require_positive("world_size", config.world_size);
  require_positive("tensor_model_parallel_size", config.tensor_model_parallel_size);
  require_positive("context_parallel_size", config.context_parallel_size);
  require_positive("pipeline_model_parallel_size", config.pipeline_model_parallel_size);
  require_positive("expert_model_parallel_size", config.expert_model_parallel_size);
  if (config.expert_tensor_parallel_size < 0) {
    throw std::invalid_argument("expert_tensor_parallel_size=" + str(config.expert_tensor_parallel_size) +
                                " is invalid: use >= 1, or 0 to follow tensor_model_parallel_size");
  }
  if (config.tensor_parallel_num_weight_shards < 0 || config.expert_tensor_parallel_num_weight_shards < 0) {
    throw std::invalid_argument("a *_num_weight_shards value is negative: use a multiple of the TP size, or 0 to "
                                "leave GTP off");
  }

  ParallelSizes sizes;
  sizes.world_size = config.world_size;
  sizes.tp = config.tensor_model_parallel_size;
  sizes.cp = config.context_parallel_size;
  sizes.pp = config.pipeline_model_parallel_size;
  sizes.ep = config.expert_model_parallel_size;
  sizes.expt_tp = config.expert_tensor_parallel_size == 0 ? sizes.tp : config.expert_tensor_parallel_size;
  sizes.tensor_parallel_num_weight_shards =
      config.tensor_parallel_num_weight_shards == 0 ? sizes.tp : config.tensor_parallel_num_weight_shards;
  sizes.expert_tensor_parallel_num_weight_shards = config.expert_tensor_parallel_num_weight_shards == 0
                                                       ? sizes.expt_tp
                                                       : config.expert_tensor_parallel_num_weight_shards;
  sizes.gtp_remat = derive_remat_size(sizes.tensor_parallel_num_weight_shards, sizes.tp,
                                      "tensor_parallel_num_weight_shards", "tensor_model_parallel_size");
  sizes.expt_gtp_remat =
      derive_remat_size(sizes.expert_tensor_parallel_num_weight_shards, sizes.expt_tp,
                        "expert_tensor_parallel_num_weight_shards", "expert_tensor_parallel_size");

  const long long dense = 1LL * sizes.tp * sizes.gtp_remat * sizes.cp * sizes.pp;
  require_divides(sizes.world_size, dense,
                  "tp*gtp_remat*cp*pp (" + str(sizes.tp) + "*" + str(sizes.gtp_remat) + "*" + str(sizes.cp) + "*" +
                      str(sizes.pp) + ")");
  const long long expert = 1LL * sizes.expt_tp * sizes.ep * sizes.expt_gtp_remat * sizes.pp;
  require_divides(sizes.world_size, expert,
                  "expt_tp*ep*expt_gtp_remat*pp (" + str(sizes.expt_tp) + "*" + str(sizes.ep) + "*" +
                      str(sizes.expt_gtp_remat) + "*" + str(sizes.pp) + ")");
  sizes.dp = static_cast<int>(sizes.world_size / dense);
  sizes.expt_dp = static_cast<int>(sizes.world_size / expert);
  return sizes;
}

HyperCommGrid make_gtp_grid(const ParallelSizes& sizes, int rank_offset) {
  HyperCommGrid grid({sizes.tp, sizes.gtp_remat, sizes.cp, sizes.dp, sizes.pp},
                     {"tp", "gtp_remat", "cp", "dp", "pp"}, rank_offset, rank_offset + sizes.world_size);
  grid.add_view(kExpertView, {sizes.expt_tp, sizes.ep, sizes.expt_gtp_remat, sizes.expt_dp, sizes.pp},
                {"expt_tp", "ep", "expt_gtp_remat", "expt_dp", "pp"}, {"pp"});
  return grid;
}

DataParallelRank data_parallel_rank(const ParallelSizes& sizes, int rank) {
  if (rank < 0 || rank >= sizes.world_size) {
    throw std::invalid_argument("rank " + str(rank) + " is outside [0, world_size=" + str(sizes.world_size) + ")");
  }
  const int gtp = (rank / sizes.tp) % sizes.gtp_remat;
  const int dp = (rank / (sizes.tp * sizes.gtp_remat * sizes.cp)) % sizes.dp;
  return DataParallelRank{gtp + sizes.gtp_remat * dp, sizes.data_ranks()};
}

BatchAccounting batch_accounting(const ParallelSizes& sizes, int64_t global_batch_size, int64_t micro_batch_size) {
  require_positive("global_batch_size", global_batch_size);
  require_positive("micro_batch_size", micro_batch_size);
  const int64_t per_microbatch = micro_batch_size * sizes.data_ranks();
  if (global_batch_size % per_microbatch != 0) {
    throw std::invalid_argument("global_batch_size=" + str(global_batch_size) +
                                " is not divisible by micro_batch_size*dp*gtp_remat = " + str(micro_batch_size) + "*" +
                                str(sizes.dp) + "*" + str(sizes.gtp_remat) + " = " + str(per_microbatch) +
                                ": use a multiple of " + str(per_microbatch));
  }
  return BatchAccounting{global_batch_size / per_microbatch, global_batch_size};
}

WireFormat parse_wire_format(const std::string& name) {
  if (name == "bf16") return WireFormat::kBf16;
  if (name == "fp8") return WireFormat::kFp8;
  if (name == "mxfp8") return WireFormat::kMxfp8;
  if (name == "nvfp4") return WireFormat::kNvfp4;
  throw std::invalid_argument("wire format '" + name + "' is unknown: use one of bf16, fp8, mxfp8, nvfp4");
}

const char* to_string(WireFormat format) {
  switch (format) {
    case WireFormat::kBf16: return "bf16";
    case WireFormat::kFp8: return "fp8";
    case WireFormat::kMxfp8: return "mxfp8";
    case WireFormat::kNvfp4: return "nvfp4";
  }
  return "unknown";
}

int alignment_rows(WireFormat format) { return format == WireFormat::kMxfp8 ? 32 : 16; }

ShardPadding shard_padding(int64_t tp_local_rows, int gtp_remat, WireFormat format) {
  require_positive("tp_local_rows", tp_local_rows);
  require_positive("gtp_remat", gtp_remat);
  const int64_t align = static_cast<int64_t>(alignment_rows(format)) * gtp_remat;
  ShardPadding padding;
  padding.rows = tp_local_rows;
  padding.pad_rows = (align - tp_local_rows % align) % align;
  padding.padded_rows = tp_local_rows + padding.pad_rows;
  padding.shard_rows = padding.padded_rows / gtp_remat;
  return padding;
}

}  // namespace gtp::topology

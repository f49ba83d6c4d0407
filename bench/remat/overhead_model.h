// The shape shared by the remat host-overhead benchmarks: a step of kCallsPerStep materialize +
// release calls of `weights_per_call` tiny BF16 weights each, then drain, so that after warm-up every
// call is a prefetch hit and the timed loop measures bookkeeping. Also the bound the cache must keep:
// (depth + 1) x the largest weight group (docs/remat.md, Cache).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/wire_format.h"
#include "remat/registry.h"

namespace gtp::bench::remat {

inline constexpr int kCallsPerStep = 8;
inline constexpr std::int64_t kRows = 16;  // tiny: a gather + unpack is a few hundred bytes
inline constexpr std::int64_t kCols = 32;
inline constexpr int kWarmupSteps = 3;     // recording, first prefetching step, one more

// Slot bytes of one materialize call of `weights` such weights on a group of `group_size` (the runtime's
// layout: the G gathered chunks, then the BF16 output, per weight; a BF16 wire is gathered in place and
// has no output region).
inline std::int64_t group_bytes(std::int64_t weights, std::int64_t group_size,
                                kernels::WireFormat format = kernels::WireFormat::kBF16) {
  const kernels::WireSpec spec{format};
  const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, group_size);
  const auto layout = kernels::chunk_layout(spec, geometry.shard_rows, kCols);
  const std::int64_t output =
      format == kernels::WireFormat::kBF16
          ? 0
          : std::max(kernels::round_up(kRows * kCols * 2, kernels::kSectionAlignment),
                     gtp::remat::gemm_placement(spec, geometry).bytes);
  return weights * (group_size * layout.chunk_bytes + output);
}

// Arguments of every benchmark: weights per call x prefetch depth.
template <typename B>
void overhead_args(B* b) {
  for (int weights : {1, 8, 64})
    for (int depth = 1; depth <= 4; ++depth) b->Args({weights, depth});
}

}  // namespace gtp::bench::remat

// The --format rows of gtp-bench all_gather: one weight = a BF16 shard [shard_rows, kWireCols] per rank,
// packed into ONE wire chunk (data, scales and scalars), gathered with ONE all-gather, and unpacked to
// the full BF16 weight. This file: geometry, the single-process reference weight, the check, the row
// summary, and the host path (CPU reference kernels over the host transport); nccl_bench.h has the GPU
// path (CUDA kernels, NCCL).
#pragma once

#include <cstdint>
#include <vector>

#include "bench/collectives/collective_bench.h"
#include "comm/bootstrap.h"
#include "comm/host.h"
#include "kernels/wire_format.h"

namespace gtp::bench {

// options.format with TransformerEngine's defaults (MXFP8 RCEIL, NVFP4 1D blocks).
kernels::WireSpec wire_spec(const BenchOptions& options);
// The weight of `point` (a --format sweep point) split over `group_size` ranks.
kernels::WeightGeometry wire_geometry(const BenchOptions& options, const SweepPoint& point, int group_size);
kernels::ChunkLayout wire_layout(const BenchOptions& options, const SweepPoint& point);

// What every rank must unpack: each rank's shard (make_input) packed and unpacked by the CPU reference
// in this one process.
std::vector<std::uint16_t> reference_weight(const BenchOptions& options, const SweepPoint& point, int group_size);
// Elements whose BF16 bits differ.
long long count_mismatches(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& expected);

struct WireTimes {
  double pack_us = 0, gather_us = 0, unpack_us = 0, e2e_us = 0;  // this rank's means per iteration
};
// Collective over `bootstrap` (the whole job): averages times over ranks, sums the wrong counts.
// `bf16_gather_us` is the BF16 gather of the same weight measured in the same run (its row's time).
BenchRow summarize_wire(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point,
                        const WireTimes& times, long long wrong, const std::string& path, int group_size,
                        double bf16_gather_us);

// The host path of one size: pack_reference, HostComm::all_gather, unpack_reference, timed on the host.
BenchRow run_host_wire(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options,
                       const SweepPoint& point, double bf16_gather_us);

}  // namespace gtp::bench

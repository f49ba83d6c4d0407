// The GPU path of gtp-bench: one GPU per rank, a world NcclComm over the bootstrap, and for every size
// two rows measured side by side with CUDA events:
//   "nccl"       raw ncclAllGather / ncclReduceScatter on a plain non-blocking stream (the baseline);
//   "gtp_stream" the same collective issued the way libgtp issues it: on the group's highest-priority
//                side stream from comm/streams, ordered after a consumer stream and waited on by it
//                (run_ordered), so its ratio to "nccl" is the cost of that machinery;
//   "gtp_wire"   with --format (all_gather): pack_cuda + ONE ncclAllGather of the wire chunks + unpack_cuda
//                on the plain stream, each part and the whole timed with CUDA events; its ratio is to the
//                "nccl" row, the BF16 gather of the same weight.
// The collective runs on this rank's group (NcclComm::split of the world) unless the group is the world.
#pragma once

#include <chrono>
#include <vector>

#include "bench/collectives/bench_groups.h"
#include "bench/collectives/collective_bench.h"
#include "comm/bootstrap.h"

namespace gtp::bench {

// Number of CUDA devices (0 when there is none or no driver).
int cuda_device_count();

// Collective over `bootstrap`; uses device `device` on this rank.
std::vector<BenchRow> run_nccl_bench(comm::Bootstrap& bootstrap, const BenchOptions& options, int device,
                                     std::chrono::milliseconds timeout, const BenchGroups& groups);

}  // namespace gtp::bench

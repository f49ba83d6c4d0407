// A size-1 group for the CUDA backend's tests: a world of one on device 0 and a second communicator
// split from it, as the C ABI builds a group (gather, reduce-scatter).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/nccl.h"
#include "comm/thread_bootstrap.h"
#include "remat/cuda_backend.h"

namespace gtp::remat::testing {

inline constexpr std::chrono::milliseconds kSizeOneGroupTimeout{30000};

struct SizeOneGroup {
  std::vector<std::unique_ptr<comm::ThreadBootstrap>> bootstrap =
      comm::ThreadBootstrap::create_group(1, kSizeOneGroupTimeout);
  comm::NcclComm gather = comm::NcclComm::create_world(*bootstrap[0], kSizeOneGroupTimeout);
  comm::NcclComm reduce_scatter = gather.split({{0}}, {}, kSizeOneGroupTimeout);
  std::vector<CudaGroup> groups() { return {CudaGroup{&gather, &reduce_scatter}}; }
};

}  // namespace gtp::remat::testing

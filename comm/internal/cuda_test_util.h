// GPU test helpers: how many CUDA devices there are, and why there are none.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace gtp::comm::internal {

// Number of usable devices; `reason` says why it is 0.
inline int cuda_devices(std::string* reason) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *reason = cudaGetErrorString(error);
    return 0;
  }
  if (count == 0) *reason = "cudaGetDeviceCount returned 0";
  return count;
}

}  // namespace gtp::comm::internal

// Skips the current test, with the reason, when fewer than `n` CUDA devices are present.
#define GTP_REQUIRE_CUDA_DEVICES(n)                                                                  \
  do {                                                                                               \
    std::string gtp_reason_;                                                                         \
    const int gtp_count_ = ::gtp::comm::internal::cuda_devices(&gtp_reason_);                        \
    if (gtp_count_ == 0) GTEST_SKIP() << "no CUDA device: " << gtp_reason_;                          \
    if (gtp_count_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << gtp_count_;  \
  } while (0)

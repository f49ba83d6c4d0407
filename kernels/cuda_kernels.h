// CUDA pack / unpack kernels, bit-identical to the CPU reference (reference.h). Every function
// checks its arguments on the host first (std::invalid_argument, nothing enqueued), then enqueues
// its work on `stream` and returns without synchronizing. All pointers are device memory.
// Launch failures throw std::runtime_error with CUDA's message.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/arguments.h"

namespace gtp::kernels {

// True when a CUDA device can be used; otherwise `why` says what is missing.
bool cuda_device_available(std::string* why);

// amax_out[0] = largest |x| over the finite elements of rows x cols values.
void amax_cuda(const void* src, SourceDtype dtype, int64_t rows, int64_t cols, float* amax_out,
               cudaStream_t stream);

// Shard -> wire chunk. With args.amax null, FP8 and NVFP4 first reduce the shard's own amax (into
// the chunk's scalars section, so no workspace is needed).
void pack_cuda(const WireSpec& spec, const PackArgs& args, cudaStream_t stream);

// Gathered chunks -> BF16 weight [rows, cols], padding stripped, each chunk with its own scales.
void unpack_cuda(const WireSpec& spec, const GatheredChunks& in, void* out_bf16,
                 int64_t out_capacity, cudaStream_t stream);

// unpack_cuda of n jobs sharing one spec (shapes may differ), each output bit-identical to
// unpack_cuda's, in ceil(n / kUnpackJobsPerLaunch) kernel launches instead of n (BF16 wire: one
// device copy per job, as unpack_cuda). All jobs are validated first (validate_unpack_many: the
// message names the bad job's index) and nothing is enqueued if one is bad. Outputs must not overlap.
void unpack_many_cuda(const WireSpec& spec, const UnpackJob* jobs, int64_t n, cudaStream_t stream);
// Jobs per unpack_many_cuda launch: the job descriptors travel as kernel parameters, and this many
// fit the classic 4 KiB parameter limit (unpack.cu asserts it).
inline constexpr int64_t kUnpackJobsPerLaunch = 48;

// Gathered chunks -> GEMM-ready codes, scales, optional exact transpose, per-chunk decode scales.
void unpack_gemm_cuda(const WireSpec& spec, const GatheredChunks& in, const GemmOutputs& out,
                      cudaStream_t stream);

}  // namespace gtp::kernels

// CPU reference of every wire format: the executable spec (element by element, no shortcuts), used
// by the tests as ground truth and by the host backend as its codec. All pointers are host memory.
#pragma once

#include <cstdint>

#include "kernels/arguments.h"

namespace gtp::kernels {

// Largest |x| over the finite elements of rows x cols values (0 if none).
float amax_reference(const void* src, SourceDtype dtype, int64_t rows, int64_t cols);

// Shard -> wire chunk. Writes every byte of the chunk's chunk_bytes (section padding is zero).
void pack_reference(const WireSpec& spec, const PackArgs& args);

// Gathered chunks -> the full weight as BF16, [rows, cols] row-major, padding stripped. Each chunk
// is decoded with its own scalars, so chunks need not share a scale.
void unpack_reference(const WireSpec& spec, const GatheredChunks& in, void* out_bf16,
                      int64_t out_capacity);

// unpack_reference of each job, in order, after all n jobs passed validate_unpack_many (a bad job
// is refused, naming its index, before any output is written).
void unpack_many_reference(const WireSpec& spec, const UnpackJob* jobs, int64_t n);

// Gathered chunks -> GEMM-ready codes and scales for the whole weight (see GemmLayoutSizes).
void unpack_gemm_reference(const WireSpec& spec, const GatheredChunks& in, const GemmOutputs& out);

}  // namespace gtp::kernels

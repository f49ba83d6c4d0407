// Arguments of pack and unpack, shared by the CPU reference and the CUDA kernels, and the checks
// both run before touching any output: bad input is refused whole, nothing is half written.
#pragma once

#include <cstdint>

#include "kernels/wire_format.h"

namespace gtp::kernels {

struct PackArgs {
  const void* shard = nullptr;  // valid_rows x cols, row-major, of src_dtype (may be null if
                                // valid_rows == 0)
  SourceDtype src_dtype = SourceDtype::kBF16;
  int64_t shard_rows = 0;       // rows of the chunk: valid rows then zero padding
  int64_t valid_rows = 0;       // rows read from `shard`
  int64_t cols = 0;
  // FP8 and NVFP4 only: the tensor amax to encode with, already reduced over the weight's group,
  // in the same memory space as `shard`. Null: the shard's own amax. A negative, NaN or infinite
  // value is treated as 0 (scale 1), so a bad reduction can never produce a NaN scale.
  const float* amax = nullptr;
  void* chunk = nullptr;
  int64_t chunk_capacity = 0;   // bytes writable at `chunk`
};

// The all-gathered chunks of one weight, in group-rank order.
struct GatheredChunks {
  const void* chunks = nullptr;
  int64_t capacity = 0;         // bytes readable at `chunks`
  WeightGeometry geometry;      // rows, cols, G of the whole TP-local weight
};

// One weight of a multi-weight unpack to the BF16 layout (unpack_many_*): its gathered chunks and
// where its BF16 weight goes, exactly unpack_*'s arguments. Every job of a call shares one WireSpec.
struct UnpackJob {
  GatheredChunks in;
  void* out_bf16 = nullptr;
  int64_t out_capacity = 0;     // bytes writable at out_bf16
};

// Outputs of unpack to the GEMM-ready layout; sizes from gemm_layout_sizes().
struct GemmOutputs {
  void* data = nullptr;
  int64_t data_capacity = 0;
  void* scales = nullptr;              // required when the format has block scales
  int64_t scales_capacity = 0;
  void* transposed_data = nullptr;     // optional (null: not produced)
  int64_t transposed_data_capacity = 0;
  void* transposed_scales = nullptr;   // required with transposed_data for NVFP4 2D
  int64_t transposed_scales_capacity = 0;
  float* decode_scales = nullptr;      // FP8 / NVFP4: one per chunk, group_size entries
  int64_t decode_scales_capacity = 0;  // entries
  ScaleLayout scale_layout = ScaleLayout::kRowMajor;  // of scales and transposed_scales
};

// Each throws std::invalid_argument naming the offending value and the rule it breaks.
ChunkLayout validate_pack(const WireSpec& spec, const PackArgs& args);
ChunkLayout validate_unpack(const WireSpec& spec, const GatheredChunks& in, const void* out,
                            int64_t out_capacity);
// Every job as validate_unpack checks it, the message prefixed with the job's index ("unpack job 5
// of 8: ..."), so a bad job is refused before any job is written. n = 0 is valid (nothing to do).
void validate_unpack_many(const WireSpec& spec, const UnpackJob* jobs, int64_t n);
ChunkLayout validate_unpack_gemm(const WireSpec& spec, const GatheredChunks& in,
                                 const GemmOutputs& out);
void validate_amax_input(const void* src, SourceDtype dtype, int64_t rows, int64_t cols,
                         const float* amax_out);

}  // namespace gtp::kernels

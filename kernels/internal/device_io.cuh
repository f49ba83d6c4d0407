// Device-side helpers shared by the pack and unpack kernels: 16-byte loads of the source, the
// chunk padding writer, launch sizing and error checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/codecs.h"
#include "kernels/wire_format.h"

namespace gtp::kernels::device {

constexpr int kThreads = 256;

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(kernel) + " launch failed: " + cudaGetErrorString(err));
  }
}

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
}

// Enough blocks to cover `items` with one item per thread, capped so grid-stride loops keep every
// SM busy without an oversized grid.
inline unsigned grid_for(int64_t items) {
  static const int max_blocks = [] {
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess) {
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    }
    return sms * 16;
  }();
  const int64_t needed = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(needed < 1 ? 1 : (needed < max_blocks ? needed : max_blocks));
}

// The shard as the kernels read it: rows at or past valid_rows read as zero.
struct Source {
  const void* ptr;
  bool bf16;
  int64_t valid_rows;
  int64_t cols;
};

// Eight consecutive elements of row r starting at column c (c a multiple of 8).
__device__ __forceinline__ void load8(const Source& s, int64_t r, int64_t c, float (&v)[8]) {
  if (r >= s.valid_rows) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    return;
  }
  const int64_t i = r * s.cols + c;
  if (s.bf16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(s.ptr) + i));
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(words[k] << 16);
      v[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(s.ptr) + i);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
}

// Byte ranges of a chunk that hold no codes, scales or scalars; pack writes zeros there so every
// byte of a chunk is defined (and the all-gather moves no stale memory).
struct ChunkPadding {
  uint8_t* chunk;
  int64_t begin[3];
  int64_t end[3];
};

inline ChunkPadding chunk_padding(uint8_t* chunk, const ChunkLayout& l, int64_t scalars_written) {
  return ChunkPadding{chunk,
                      {l.data_bytes, l.scales_offset + l.scales_bytes,
                       l.scalars_offset + scalars_written},
                      {l.scales_offset, l.scalars_offset, l.chunk_bytes}};
}

__device__ __forceinline__ void write_padding(const ChunkPadding& p) {
  if (blockIdx.x != 0) return;
  for (int k = 0; k < 3; ++k)
    for (int64_t i = p.begin[k] + threadIdx.x; i < p.end[k]; i += blockDim.x) p.chunk[i] = 0;
}

__device__ __forceinline__ float sanitize_amax(float a) {
  return (codec::is_finite(a) && a > 0.0f) ? a : 0.0f;
}

// Two BF16 values in one 32-bit word, the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(codec::float_to_bf16(lo)) |
         (static_cast<uint32_t>(codec::float_to_bf16(hi)) << 16);
}

}  // namespace gtp::kernels::device

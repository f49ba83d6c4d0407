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

// A rows x items grid walked by teams of `team` threads (a power of two, at most kThreads) that
// share a row: per-row values (chunk, local row, scales) are computed once per row and no thread
// divides a flat index by the row length.
struct RowGrid {
  int64_t rows;
  int64_t items_per_row;
  int team_shift;  // log2 of the team size
};

// items_per_thread > 1 shrinks the team so each thread has that many items of a row to keep
// several loads in flight (memory-level parallelism for kernels with small loads).
inline RowGrid row_grid(int64_t rows, int64_t items_per_row, int64_t items_per_thread = 1) {
  const int64_t wanted = (items_per_row + items_per_thread - 1) / items_per_thread;
  int shift = 0;
  while ((int64_t{1} << shift) < wanted && (1 << shift) < kThreads) ++shift;
  return RowGrid{rows, items_per_row, shift};
}

inline unsigned blocks_for(const RowGrid& g) {
  const int64_t rows_per_block = kThreads >> g.team_shift;
  return grid_for((g.rows + rows_per_block - 1) / rows_per_block * kThreads);
}

// Calls row_fn(row, lane, team) for every row this thread's team owns, the grid being blocks
// `block` of `blocks` (a kernel's whole grid, or the share of one job of a multi-job launch); the
// callee walks items lane, lane + team, ... of the row.
template <typename RowFn>
__device__ __forceinline__ void for_each_row(const RowGrid& g, int64_t block, int64_t blocks,
                                             RowFn&& row_fn) {
  const int team = 1 << g.team_shift;
  const int64_t first = (block * blockDim.x + threadIdx.x) >> g.team_shift;
  const int64_t teams = (blocks * blockDim.x) >> g.team_shift;
  const int lane = threadIdx.x & (team - 1);
  for (int64_t row = first; row < g.rows; row += teams) row_fn(row, lane, team);
}

template <typename RowFn>
__device__ __forceinline__ void for_each_row(const RowGrid& g, RowFn&& row_fn) {
  for_each_row(g, blockIdx.x, gridDim.x, static_cast<RowFn&&>(row_fn));
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

// E4M3 code of one finite, non-NaN value via the hardware conversion (spec: float_to_e4m3).
__device__ __forceinline__ uint8_t e4m3_of(float x) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(pair & 0xffu);
}

__device__ __forceinline__ float sanitize_amax(float a) {
  return (codec::is_finite(a) && a > 0.0f) ? a : 0.0f;
}

// ---- Hardware fast paths of the codecs. Each must equal its spec in codecs.h bit for bit; the
// GPU tests compare every kernel output against the CPU reference to hold them to that.

// Two BF16 values in one 32-bit word, the first in the low half (cvt.rn.bf16x2.f32: RNE, NaN ->
// 0x7fff, like codec::float_to_bf16).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

// Four E4M3 codes of v[k] * multiplier, element k in byte k. cvt.rn.satfinite gives RNE with
// saturation to +-448 (Inf too); the spec's single NaN code 0x7f is patched in afterwards.
__device__ __forceinline__ uint32_t e4m3x4(const float* v, float multiplier) {
  const float a = v[0] * multiplier, b = v[1] * multiplier;
  const float c = v[2] * multiplier, d = v[3] * multiplier;
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  uint32_t word = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (codec::is_nan(a) | codec::is_nan(b) | codec::is_nan(c) | codec::is_nan(d)) {
    const float x[4] = {a, b, c, d};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (codec::is_nan(x[k])) word = (word & ~(0xffu << (8 * k))) | (0x7fu << (8 * k));
  }
  return word;
}

// The four E4M3 codes of `word` (byte k = element k) as floats, with integer ops and one exact
// multiply instead of conversion instructions (which run at a quarter of the ALU rate): the code's
// magnitude bits placed at FP32 bit 20 read as 2^-120 times the code's value — subnormal codes
// land on FP32 subnormals — and the product with 2^120 is exact. 0x7f/0xff decode to NaN.
__device__ __forceinline__ void e4m3x4_to_float(uint32_t word, float* out) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t code = (word >> (8 * k)) & 0xffu;
    const uint32_t magnitude = code & 0x7fu;
    const float value = __uint_as_float(((code & 0x80u) << 24) | (magnitude << 20)) * 0x1p120f;
    out[k] = magnitude == 0x7fu ? __uint_as_float(0x7fc00000u) : value;
  }
}

// Magnitude of an E2M1 code's low 3 bits, signed by bit 3 (spec: codec::e2m1_to_float).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t m = code & 0x7u;
  // m < 2: 0 or 0.5; else exponent (m >> 1) - 1 + 127 with mantissa bit (m & 1).
  const uint32_t normal = (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
  const uint32_t magnitude = m == 0 ? 0u : (m == 1 ? 0x3f000000u : normal);
  return __uint_as_float(magnitude | ((code & 0x8u) << 28));
}

// Stores one lane's 32 output bytes (group `item`: out_row[2 * item], out_row[2 * item + 1]).
// Where the partner lane (lane ^ 1) holds the neighbouring group, the pair swaps halves first so
// that each store instruction writes whole 32-byte sectors (the even group's, then the odd group's)
// instead of half of every sector it touches, which doubled the L2 write traffic (perf-history v7,
// v11). `paired` must be equal on both lanes of a pair: with a team of two or more lanes, lane ^ 1
// holds item ^ 1 of the same row, and both lanes of a pair see (item | 1) < n alike; the shuffle
// names exactly those two lanes.
__device__ __forceinline__ void store_group_pair(uint4* out_row, int64_t item, bool paired,
                                                 const uint4 (&group)[2]) {
  if (!paired) {
    out_row[2 * item] = group[0];
    out_row[2 * item + 1] = group[1];
    return;
  }
  const bool odd = item & 1;
  const uint4 send = odd ? group[0] : group[1];
  const unsigned lanes = 3u << (threadIdx.x & 30u);
  const uint4 received = make_uint4(
      __shfl_xor_sync(lanes, send.x, 1), __shfl_xor_sync(lanes, send.y, 1),
      __shfl_xor_sync(lanes, send.z, 1), __shfl_xor_sync(lanes, send.w, 1));
  const int64_t even_item = item & ~int64_t{1};
  out_row[2 * even_item + odd] = odd ? received : group[0];
  out_row[2 * (even_item + 1) + odd] = odd ? group[1] : received;
}

}  // namespace gtp::kernels::device

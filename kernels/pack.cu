// Pack kernels: shard -> wire chunk in one pass (block amax, scale, cast and store fused). FP8 and
// NVFP4 without a given amax run one extra reduction pass first.
#include <cuda_runtime.h>

#include "kernels/cuda_kernels.h"
#include "kernels/internal/device_io.cuh"

namespace gtp::kernels {
namespace {

using namespace device;
using namespace codec;

__global__ void amax_kernel(const void* src, bool bf16, int64_t n, float* amax_out) {
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t vectors = n / 8;
  const Source s{src, bf16, 1, n};  // the whole range as one row
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += stride) {
    float x[8];
    load8(s, 0, v * 8, x);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (is_finite(x[k])) m = max_value(m, abs_value(x[k]));
  }
  // The tail that does not fill a vector.
  for (int64_t i = vectors * 8 + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    const float x = bf16 ? bf16_to_float(static_cast<const uint16_t*>(src)[i])
                         : static_cast<const float*>(src)[i];
    if (is_finite(x)) m = max_value(m, abs_value(x));
  }
  for (int offset = 16; offset > 0; offset /= 2) m = max_value(m, __shfl_xor_sync(~0u, m, offset));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / 32; ++w) m = max_value(m, warp_max[w]);
    // Non-negative floats order like their bit patterns.
    atomicMax(reinterpret_cast<unsigned*>(amax_out), __float_as_uint(m));
  }
}

void launch_amax(const void* src, bool bf16, int64_t n, float* amax_out, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(amax_out, 0, sizeof(float), stream), "cudaMemsetAsync(amax)");
  if (n == 0) return;
  amax_kernel<<<grid_for(n / 8 + 1), kThreads, 0, stream>>>(src, bf16, n, amax_out);
  check_launch("amax_kernel");
}

__global__ void pack_bf16_kernel(Source src, uint8_t* data, RowGrid grid, ChunkPadding pad) {
  write_padding(pad);
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    for (int64_t item = lane; item < grid.items_per_row; item += team) {
      float v[8];
      load8(src, r, item * 8, v);
      uint4 out;
      out.x = pack_bf16x2(v[0], v[1]);
      out.y = pack_bf16x2(v[2], v[3]);
      out.z = pack_bf16x2(v[4], v[5]);
      out.w = pack_bf16x2(v[6], v[7]);
      reinterpret_cast<uint4*>(data + r * src.cols * 2)[item] = out;
    }
  });
}

__global__ void pack_fp8_kernel(Source src, uint8_t* data, RowGrid grid, const float* amax_in,
                                float* scalars, ChunkPadding pad) {
  write_padding(pad);
  const float amax = sanitize_amax(*amax_in);
  const float scale = fp8_encode_scale(amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[kDecodeScale] = 1.0f / scale;
    scalars[kAmax] = amax;
  }
  // 8 elements per item: one 16-byte load and one 8-byte store per thread, contiguous across
  // the lanes, so every warp instruction uses whole sectors.
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    for (int64_t item = lane; item < grid.items_per_row; item += team) {
      float v[8];
      load8(src, r, item * 8, v);
      reinterpret_cast<uint2*>(data + r * src.cols)[item] =
          make_uint2(e4m3x4(v, scale), e4m3x4(v + 4, scale));
    }
  });
}

// Four E4M3 codes of v[k] * multiplier (e4m3x4 without its NaN patch): for a block known to be
// finite, whose products cannot be NaN.
__device__ __forceinline__ uint32_t e4m3x4_of_finite(float a, float b, float c, float d, float multiplier) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b * multiplier), "f"(a * multiplier));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d * multiplier), "f"(c * multiplier));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// One thread per 32-element block of a row. The BF16 instance keeps the block as 16 packed words and
// takes the amax on the packed halves (two per instruction), which holds half the registers of 32
// floats; the FP32 instance reads floats.
template <bool kBF16Source>
__global__ void pack_mxfp8_kernel(Source src, uint8_t* data, uint8_t* scales, RowGrid grid, bool rceil,
                                  ChunkPadding pad) {
  write_padding(pad);
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    for (int64_t b = lane; b < grid.items_per_row; b += team) {
      const int64_t c = b * 32;
      uint32_t words[16];
      float v[kBF16Source ? 1 : 32];
      uint32_t top = 0;  // largest magnitude bits: NaN > Inf > finite, so it also flags the block
      if (kBF16Source) {
        if (r < src.valid_rows) {
          const uint4* p =
              reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(src.ptr) + r * src.cols + c);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const uint4 u = __ldg(p + k);
            words[4 * k] = u.x, words[4 * k + 1] = u.y, words[4 * k + 2] = u.z, words[4 * k + 3] = u.w;
          }
        } else {
#pragma unroll
          for (int k = 0; k < 16; ++k) words[k] = 0u;
        }
        uint32_t top2 = 0;
#pragma unroll
        for (int k = 0; k < 16; ++k) top2 = __vmaxu2(top2, words[k] & 0x7fff7fffu);
        top = max(top2 << 16, top2 & 0xffff0000u);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) load8(src, r, c + 8 * k, *reinterpret_cast<float(*)[8]>(v + 8 * k));
#pragma unroll
        for (int k = 0; k < 32; ++k) top = max(top, __float_as_uint(v[k]) & 0x7fffffffu);
      }
      const bool non_finite = top >= 0x7f800000u;
      const float amax = __uint_as_float(top);
      const uint8_t e = non_finite ? kE8M0NaN : (rceil ? e8m0_rceil(amax) : e8m0_floor(amax));
      const float multiplier = mx_encode_multiplier(e, rceil);
      uint4 out[2] = {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u)};
      if (!non_finite) {
        uint32_t* codes = reinterpret_cast<uint32_t*>(out);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (kBF16Source) {
            const uint32_t w0 = words[2 * k], w1 = words[2 * k + 1];
            codes[k] = e4m3x4_of_finite(__uint_as_float(w0 << 16), __uint_as_float(w0 & 0xffff0000u),
                                        __uint_as_float(w1 << 16), __uint_as_float(w1 & 0xffff0000u),
                                        multiplier);
          } else {
            codes[k] = e4m3x4_of_finite(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3], multiplier);
          }
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(data + r * src.cols + c);
      dst[0] = out[0];
      dst[1] = out[1];
      scales[r * grid.items_per_row + b] = e;
    }
  });
}

// One 16-element NVFP4 block of a row. The BF16 form keeps the 8 packed words as loaded and widens an
// element when it is encoded, which holds half the registers of 16 floats; its amax runs on the packed
// halves, two per instruction.
template <bool kBF16Source>
struct Block16;

template <>
struct Block16<true> {
  uint32_t words[8];
  __device__ __forceinline__ void load(const Source& s, int64_t r, int64_t c) {
    if (r >= s.valid_rows) {
#pragma unroll
      for (int k = 0; k < 8; ++k) words[k] = 0u;
      return;
    }
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(s.ptr) + r * s.cols + c);
    const uint4 lo = __ldg(p), hi = __ldg(p + 1);
    words[0] = lo.x, words[1] = lo.y, words[2] = lo.z, words[3] = lo.w;
    words[4] = hi.x, words[5] = hi.y, words[6] = hi.z, words[7] = hi.w;
  }
  // The largest magnitude bits as FP32 bits (integer max: NaN > Inf > every finite value, so the
  // same compare tells whether the block is finite).
  __device__ __forceinline__ uint32_t top() const {
    uint32_t top2 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) top2 = __vmaxu2(top2, words[k] & 0x7fff7fffu);
    return max(top2 << 16, top2 & 0xffff0000u);
  }
  __device__ __forceinline__ float value(int k) const {
    return __uint_as_float(k % 2 ? words[k / 2] & 0xffff0000u : words[k / 2] << 16);
  }
};

template <>
struct Block16<false> {
  float v[16];
  __device__ __forceinline__ void load(const Source& s, int64_t r, int64_t c) {
    load8(s, r, c, *reinterpret_cast<float(*)[8]>(v));
    load8(s, r, c + 8, *reinterpret_cast<float(*)[8]>(v + 8));
  }
  __device__ __forceinline__ uint32_t top() const {
    uint32_t t = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) t = max(t, __float_as_uint(v[k]) & 0x7fffffffu);
    return t;
  }
  __device__ __forceinline__ float value(int k) const { return v[k]; }
};

// a * b + c as an integer multiply-add, which runs on the FMA pipe: placing codes by shift-and-or
// would load the ALU pipe, which the code arithmetic already keeps busy.
__device__ __forceinline__ uint32_t multiply_add(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The codes of a finite block, element 2k in the low nibble of byte k. Without kSaturate, the caller
// guarantees every |x| * multiplier < 7, so no code exceeds 7: each nibble is placed still carrying
// kE2M1CandidateBase, and the bases' sum, subtracted up front (modulo 2^32), cancels them.
template <bool kSaturate, bool kBF16Source>
__device__ __forceinline__ uint2 e2m1x16(const Block16<kBF16Source>& block, float multiplier) {
  constexpr uint32_t kStart = kSaturate ? 0u : 0u - kE2M1CandidateBase * 0x11111111u;
  uint32_t words[2] = {kStart, kStart};
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const float x = block.value(k);
    const uint32_t rounded = e2m1_candidate(fabsf(x) * multiplier);
    const uint32_t magnitude = kSaturate ? min(rounded - kE2M1CandidateBase, 7u) : rounded;
    const uint32_t nibble = magnitude | ((__float_as_uint(x) >> 28) & 0x8u);
    words[k / 8] = multiply_add(nibble, 1u << (4 * (k % 8)), words[k / 8]);
  }
  return make_uint2(words[0], words[1]);
}

// 16 elements of one NVFP4 block -> 8 bytes of codes; `top` is the largest magnitude bits of the
// block (or of its 2D tile). A NaN or Inf block is all zero codes. Most blocks cannot round past 6:
// the largest |x| * multiplier, which bounds every element's, is checked once per block (blocks with
// a subnormal or zero scale can exceed it, and take the saturating form).
template <bool kBF16Source>
__device__ __forceinline__ uint2 encode_e2m1x16(const Block16<kBF16Source>& block, float multiplier,
                                                uint32_t top) {
  if (top >= 0x7f800000u) return make_uint2(0u, 0u);
  if (__uint_as_float(top) * multiplier < 7.0f) return e2m1x16<false>(block, multiplier);
  return e2m1x16<true>(block, multiplier);
}

__device__ __forceinline__ void nvfp4_global_scales(const float* amax_in, float* encode,
                                                    float* decode) {
  *encode = nvfp4_encode_scale(sanitize_amax(*amax_in));
  *decode = 1.0f / *encode;
}

// Block scale s_b = E4M3(amax * (S_enc * 1/6)) from the block's largest magnitude bits `top`
// (NaN scale when they are NaN or Inf), as codec::nvfp4_block_scale orders the FP32 operations.
__device__ __forceinline__ uint8_t nvfp4_block_scale_code(uint32_t top, float encode) {
  if (top >= 0x7f800000u) return kE4M3NaN;
  return e4m3_of(__uint_as_float(top) * (encode * (1.0f / kE2M1Max)));
}

// c = min(1 / (s_b * S_dec), FLT_MAX) (codec::nvfp4_element_multiplier); rcp.rn is exactly 1/x. The
// scale code is non-negative here (a NaN block's multiplier is never used): its magnitude bits at FP32
// bit 20 read as 2^-120 times its value, subnormal codes included, so one exact multiply decodes it.
__device__ __forceinline__ float nvfp4_multiplier(uint8_t scale, float decode) {
  const float block_scale = __uint_as_float(static_cast<uint32_t>(scale) << 20) * 0x1p120f;
  return fminf(__frcp_rn(block_scale * decode), kFloatMax);
}

// The codes and the scale of one block.
template <bool kBF16Source>
__device__ __forceinline__ uint2 encode_block(const Block16<kBF16Source>& block, float encode, float decode,
                                              uint8_t* scale) {
  const uint32_t top = block.top();
  *scale = nvfp4_block_scale_code(top, encode);
  return encode_e2m1x16(block, nvfp4_multiplier(*scale, decode), top);
}

// 1D blocks. A thread takes blocks b and b + team of a row per step (BF16; FP32 shards, twice the
// bytes per element, take one), and the next step's blocks are loaded before this step's are encoded:
// the encode is long, and without the overlap too few bytes were in flight to keep HBM busy. The
// global amax is read after the first loads are issued, so its latency hides behind them too.
template <bool kBF16Source>
__global__ void pack_nvfp4_1d_kernel(Source src, uint8_t* data, uint8_t* scales, RowGrid grid,
                                     const float* amax_in, float* scalars, ChunkPadding pad) {
  constexpr int kBlocks = kBF16Source ? 2 : 1;
  write_padding(pad);
  const int team = 1 << grid.team_shift;
  const int lane = threadIdx.x & (team - 1);
  const int64_t teams = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> grid.team_shift;
  const int64_t step = int64_t{kBlocks} * team;
  // This thread's steps: rows first_row, first_row + teams, ...; in each, blocks lane, lane + step, ...
  // (lane < items_per_row always: row_grid rounds the team to at most the items per step).
  int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> grid.team_shift;
  int64_t b = lane;
  Block16<kBF16Source> next[kBlocks];
  auto load_step = [&](int64_t r, int64_t first) {
    if (r >= grid.rows) return;
#pragma unroll
    for (int k = 0; k < kBlocks; ++k)
      if (first + k * team < grid.items_per_row) next[k].load(src, r, (first + k * team) * 16);
  };
  load_step(row, b);
  float encode, decode;
  nvfp4_global_scales(amax_in, &encode, &decode);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[kDecodeScale] = decode;
    scalars[kAmax] = sanitize_amax(*amax_in);
  }
  while (row < grid.rows) {
    Block16<kBF16Source> current[kBlocks];
#pragma unroll
    for (int k = 0; k < kBlocks; ++k) current[k] = next[k];
    const int64_t current_row = row, current_b = b;
    b += step;
    if (b >= grid.items_per_row) b = lane, row += teams;
    load_step(row, b);
#pragma unroll
    for (int k = 0; k < kBlocks; ++k) {
      const int64_t item = current_b + k * team;
      if (item >= grid.items_per_row) break;
      const int64_t index = current_row * grid.items_per_row + item;
      uint8_t scale;
      reinterpret_cast<uint2*>(data)[index] = encode_block(current[k], encode, decode, &scale);
      scales[index] = scale;
    }
  }
}

// 2D blocks: a warp per four side-by-side 16x16 tiles (16 rows x 64 columns, a "strip"), a half-warp
// per two of them, one lane per row of the pair: each lane stores 16 bytes of codes, so the two lanes
// of a row write one whole 32-byte sector (with one tile per lane, each store instruction wrote half
// sectors). The tile amax is a 16-lane reduction; whole warps walk the grid together so every shuffle
// has all 32 lanes. As in 1D, the next strip is loaded before this one is encoded.
template <bool kBF16Source>
__global__ void __launch_bounds__(kThreads, 4) pack_nvfp4_2d_kernel(Source src, uint8_t* data, uint8_t* scales, int64_t rows,
                                     const float* amax_in, float* scalars, ChunkPadding pad) {
  write_padding(pad);
  const int64_t tiles_per_row = src.cols / 16;
  const int64_t strips_per_row = (tiles_per_row + 3) / 4;
  const int64_t tile_rows = rows / 16;
  const int lane = threadIdx.x % 32, half = lane / 16, row_in_tile = lane % 16;
  // Warps walk strips (tile_row, strip_column) in row-major order, `warps` apart; the position is
  // advanced by addition with a carry, as a 64-bit division per strip costs more than the encode.
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t row_step = warps / strips_per_row, column_step = warps % strips_per_row;
  struct Position {
    int64_t tile_row, column;
  };
  auto advance = [&](Position p) {
    p.tile_row += row_step;
    p.column += column_step;
    if (p.column >= strips_per_row) p.column -= strips_per_row, ++p.tile_row;
    return p;
  };
  // This lane's tile pair of a strip: row r, columns c .. c + 31 (the second tile may not exist).
  struct Pair {
    int64_t r, c, first_tile;
    bool has_first, has_second;
  };
  auto pair_of = [&](Position p) {
    Pair pair;
    pair.first_tile = p.column * 4 + 2 * half;
    pair.has_first = pair.first_tile < tiles_per_row;
    pair.has_second = pair.first_tile + 1 < tiles_per_row;
    pair.r = p.tile_row * 16 + row_in_tile;
    pair.c = pair.first_tile * 16;
    return pair;
  };
  Block16<kBF16Source> next[2];
  auto load_pair = [&](Position p) {
    if (p.tile_row >= tile_rows) return;
    const Pair pair = pair_of(p);
    if (pair.has_first) next[0].load(src, pair.r, pair.c);
    if (pair.has_second) next[1].load(src, pair.r, pair.c + 16);
  };
  const int64_t first_strip = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  Position position{first_strip / strips_per_row, first_strip % strips_per_row};
  // FP32 strips are twice the registers: those load in turn.
  if (kBF16Source) load_pair(position);
  float encode, decode;
  nvfp4_global_scales(amax_in, &encode, &decode);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[kDecodeScale] = decode;
    scalars[kAmax] = sanitize_amax(*amax_in);
  }
  for (; position.tile_row < tile_rows; position = advance(position)) {
    if (!kBF16Source) load_pair(position);
    const Block16<kBF16Source> block[2] = {next[0], next[1]};
    if (kBF16Source) load_pair(advance(position));
    const Pair p = pair_of(position);
    uint32_t top[2] = {p.has_first ? block[0].top() : 0u, p.has_second ? block[1].top() : 0u};
    // Each tile's largest magnitude bits over its 16 rows. BF16 tops have 16 zero low bits, so the
    // two travel as the halves of one word: half the shuffles, and fewer live registers.
    if constexpr (kBF16Source) {
      uint32_t both = (top[0] >> 16) | top[1];
      for (int offset = 8; offset > 0; offset /= 2)
        both = __vmaxu2(both, __shfl_xor_sync(~0u, both, offset));
      top[0] = both << 16;
      top[1] = both & 0xffff0000u;
    } else {
      for (int offset = 8; offset > 0; offset /= 2) {
        top[0] = max(top[0], __shfl_xor_sync(~0u, top[0], offset));
        top[1] = max(top[1], __shfl_xor_sync(~0u, top[1], offset));
      }
    }
    if (!p.has_first) continue;
    uint2 codes[2];
    uint8_t scale[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      scale[t] = nvfp4_block_scale_code(top[t], encode);
      codes[t] = encode_e2m1x16(block[t], nvfp4_multiplier(scale[t], decode), top[t]);
    }
    // Rows are 8-byte aligned (cols is a multiple of 16); with cols a multiple of 32 they are 16.
    uint8_t* out = data + (p.r * src.cols + p.c) / 2;
    if (p.has_second && (reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
      *reinterpret_cast<uint4*>(out) = make_uint4(codes[0].x, codes[0].y, codes[1].x, codes[1].y);
    } else {
      reinterpret_cast<uint2*>(out)[0] = codes[0];
      if (p.has_second) reinterpret_cast<uint2*>(out)[1] = codes[1];
    }
    if (row_in_tile == 0) {
      uint8_t* tile_scales = scales + position.tile_row * tiles_per_row + p.first_tile;
      tile_scales[0] = scale[0];
      if (p.has_second) tile_scales[1] = scale[1];
    }
  }
}

template <auto Kernel, typename... Args>
void launch(int64_t threads, cudaStream_t stream, Args... args) {
  Kernel<<<grid_for(threads), kThreads, 0, stream>>>(args...);
}

}  // namespace

void amax_cuda(const void* src, SourceDtype dtype, int64_t rows, int64_t cols, float* amax_out,
               cudaStream_t stream) {
  validate_amax_input(src, dtype, rows, cols, amax_out);
  launch_amax(src, dtype == SourceDtype::kBF16, rows * cols, amax_out, stream);
}

void pack_cuda(const WireSpec& spec, const PackArgs& args, cudaStream_t stream) {
  const ChunkLayout l = validate_pack(spec, args);
  auto* chunk = static_cast<uint8_t*>(args.chunk);
  uint8_t* data = chunk + l.data_offset;
  uint8_t* scales = chunk + l.scales_offset;
  auto* scalars = reinterpret_cast<float*>(chunk + l.scalars_offset);
  const bool bf16 = args.src_dtype == SourceDtype::kBF16;
  const Source src{args.shard, bf16, args.valid_rows, args.cols};
  const int64_t rows = l.shard_rows;
  // FP8 and NVFP4 without a given amax reduce their own into the chunk's amax slot first.
  const float* amax = args.amax;
  if ((spec.format == WireFormat::kFP8 || spec.format == WireFormat::kNVFP4) && amax == nullptr) {
    launch_amax(args.shard, bf16, args.valid_rows * l.cols, scalars + kAmax, stream);
    amax = scalars + kAmax;
  }
  const ChunkPadding pad = chunk_padding(chunk, l, l.scalars_bytes > 0 ? 2 * sizeof(float) : 0);
  switch (spec.format) {
    case WireFormat::kBF16: {
      const RowGrid grid = row_grid(rows, l.cols / 8);
      pack_bf16_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(src, data, grid, pad);
      check_launch("pack_bf16_kernel");
      break;
    }
    case WireFormat::kFP8: {
      const RowGrid grid = row_grid(rows, l.cols / 8);
      pack_fp8_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(src, data, grid, amax, scalars,
                                                                 pad);
      check_launch("pack_fp8_kernel");
      break;
    }
    case WireFormat::kMXFP8: {
      const RowGrid grid = row_grid(rows, l.cols / 32);
      const bool rceil = spec.mx_rounding == ScaleRounding::kRceil;
      if (bf16) {
        pack_mxfp8_kernel<true><<<blocks_for(grid), kThreads, 0, stream>>>(src, data, scales, grid, rceil,
                                                                            pad);
      } else {
        pack_mxfp8_kernel<false><<<blocks_for(grid), kThreads, 0, stream>>>(src, data, scales, grid, rceil,
                                                                             pad);
      }
      check_launch("pack_mxfp8_kernel");
      break;
    }
    case WireFormat::kNVFP4:
      if (spec.nvfp4_blocks == Nvfp4Blocks::k1D) {
        const RowGrid grid = row_grid(rows, l.cols / 16, bf16 ? 2 : 1);
        const int64_t threads = grid.rows << grid.team_shift;
        if (bf16) {
          launch<pack_nvfp4_1d_kernel<true>>(threads, stream, src, data, scales, grid, amax, scalars, pad);
        } else {
          launch<pack_nvfp4_1d_kernel<false>>(threads, stream, src, data, scales, grid, amax, scalars, pad);
        }
        check_launch("pack_nvfp4_1d_kernel");
      } else {
        const int64_t threads = (rows / 16) * ((l.cols / 16 + 3) / 4) * 32;  // a warp per 16 x 64 strip
        if (bf16) {
          launch<pack_nvfp4_2d_kernel<true>>(threads, stream, src, data, scales, rows, amax, scalars, pad);
        } else {
          launch<pack_nvfp4_2d_kernel<false>>(threads, stream, src, data, scales, rows, amax, scalars, pad);
        }
        check_launch("pack_nvfp4_2d_kernel");
      }
      break;
  }
}

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (why) *why = "cudaGetDeviceCount reports 0 devices";
    return false;
  }
  return true;
}

}  // namespace gtp::kernels

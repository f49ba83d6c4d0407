// Unpack kernels: gathered chunks -> the BF16 weight, or the GEMM-ready layout. Each pass maps
// output rows to (chunk, local row), which de-interleaves the chunks and strips the padding, and
// moves the block scales into whole-weight arrays in the same pass.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_kernels.h"
#include "kernels/internal/device_io.cuh"
#include "kernels/transpose.h"

namespace gtp::kernels {
namespace {

using namespace device;
using namespace codec;

struct Chunks {
  const uint8_t* base;
  int64_t chunk_bytes;
  int64_t shard_rows;
  int64_t cols;
  int64_t scales_offset;
  int64_t scalars_offset;
  __device__ const uint8_t* chunk_of(int64_t r) const { return base + (r / shard_rows) * chunk_bytes; }
  // The chunk holding row r, for formats whose shards are whole 16-row bands (all but BF16): a
  // 32-bit division of band numbers, far cheaper than the 64-bit division of row numbers, which
  // the tile kernels would pay on every row they load (exact below 2^36 rows).
  __device__ uint32_t chunk_by_band(int64_t r) const {
    return static_cast<uint32_t>(r >> 4) / static_cast<uint32_t>(shard_rows >> 4);
  }
  __device__ const uint8_t* code_row_by_band(int64_t r, int64_t row_bytes) const {
    const uint32_t chunk = chunk_by_band(r);
    return base + chunk * chunk_bytes + (r - int64_t{chunk} * shard_rows) * row_bytes;
  }
  // Row r's block scales, `per_row` bytes, for the 1D-block formats (MXFP8, NVFP4 1D).
  __device__ const uint8_t* scale_row(int64_t r, int64_t per_row) const {
    const uint32_t chunk = chunk_by_band(r);
    return base + chunk * chunk_bytes + scales_offset + (r - int64_t{chunk} * shard_rows) * per_row;
  }
  // The block scales of NVFP4 2D 16-row band `band`, `per_row` bytes.
  __device__ const uint8_t* band_scale_row(int64_t band, int64_t per_row) const {
    const uint32_t chunk = chunk_by_band(16 * band);
    return base + chunk * chunk_bytes + scales_offset + (band - int64_t{chunk} * (shard_rows / 16)) * per_row;
  }
  __device__ float decode_scale(const uint8_t* chunk) const {
    // Chunks are read-only for the whole kernel: every read takes the non-coherent path.
    return __ldg(reinterpret_cast<const float*>(chunk + scalars_offset + kDecodeScale * sizeof(float)));
  }
};

// One NVFP4 group of 16 elements (one block) -> 16 BF16, through a per-block table instead of a
// per-element decode: entry k = bf16((e2m1(k) * s_b) * S_dec) for the 8 magnitudes, computed in
// the spec's FP32 order, split into a high-byte and a low-byte table of 8 bytes each; `prmt`
// (__byte_perm) then looks up four elements per instruction by their 3-bit magnitude codes, and
// the sign bit of each code is XORed into the high byte. That equals the spec element by element
// because (-q * s_b) * S_dec = -((q * s_b) * S_dec) in IEEE arithmetic and BF16 RNE is symmetric,
// except for NaN (the spec's NaN is 0x7fff whatever the sign), so a block whose table holds a NaN
// (then entry 0 is NaN: s_b or S_dec NaN, or S_dec infinite) takes the per-element path.
__device__ __forceinline__ void nvfp4_decode16_bf16(uint2 codes, float block_scale,
                                                    float chunk_scale, uint4 (&out)[2]) {
  float m[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) m[k] = (e2m1_value(k) * block_scale) * chunk_scale;
  uint32_t w[8];
  if (codec::is_nan(m[0])) {
    const uint32_t words[2] = {codes.x, codes.y};
#pragma unroll
    for (int k = 0; k < 16; k += 2) {
      const float a = (e2m1_value(words[k / 8] >> (4 * (k % 8))) * block_scale) * chunk_scale;
      const float b = (e2m1_value(words[k / 8] >> (4 * (k % 8 + 1))) * block_scale) * chunk_scale;
      w[k / 2] = pack_bf16x2(a, b);
    }
  } else {
    const uint32_t t0 = pack_bf16x2(m[0], m[1]), t1 = pack_bf16x2(m[2], m[3]);
    const uint32_t t2 = pack_bf16x2(m[4], m[5]), t3 = pack_bf16x2(m[6], m[7]);
    const uint32_t high_a = __byte_perm(t0, t1, 0x7531), high_b = __byte_perm(t2, t3, 0x7531);
    const uint32_t low_a = __byte_perm(t0, t1, 0x6420), low_b = __byte_perm(t2, t3, 0x6420);
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // four elements: nibbles j = 0..3 of c
      const uint32_t c = (q < 2 ? codes.x : codes.y) >> (16 * (q % 2));
      const uint32_t magnitudes = c & 0x7777u;
      // Byte j of `nibbles` = nibble j of c, so each code's sign bit moves to its byte's bit 7.
      const uint32_t spread = (c & 0xffu) | ((c << 8) & 0xff0000u);
      const uint32_t nibbles = (spread & 0x000f000fu) | ((spread << 4) & 0x0f000f00u);
      const uint32_t high = __byte_perm(high_a, high_b, magnitudes) ^ ((nibbles << 4) & 0x80808080u);
      const uint32_t low = __byte_perm(low_a, low_b, magnitudes);
      w[2 * q] = __byte_perm(low, high, 0x5140);      // elements 4q, 4q+1
      w[2 * q + 1] = __byte_perm(low, high, 0x7362);  // elements 4q+2, 4q+3
    }
  }
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// Each thread decodes kUnroll groups of output elements of a row per step, with all their
// loads issued first. FP8 and MXFP8 groups are 8 elements: a group's BF16 outputs are one 16-byte
// store and neighbouring lanes take neighbouring groups, so each warp store instruction writes
// 512 contiguous bytes. With 16-element groups (two 16-byte stores 32 bytes apart) each
// instruction covered half of every sector it touched, and the partial writes cost up to twice
// the L2 write traffic (ncu, v7 in perf-history). NVFP4 groups are 16 elements, one block, decoded
// through the block's table (nvfp4_decode16_bf16); 8-element groups measured slower there.
// Format is a template parameter so each kernel carries only its own decode. The rows are walked by
// blocks `block` of `blocks`: the whole grid of unpack_bf16_kernel, or one job's share of an
// unpack_many_bf16_kernel launch, so both run this same code.
template <WireFormat kFormat>
__device__ __forceinline__ void unpack_bf16_rows(const Chunks& in, uint16_t* out, const RowGrid& grid,
                                                 bool blocks_2d, int64_t block, int64_t blocks) {
  constexpr int kUnroll = 4;
  for_each_row(grid, block, blocks, [&](int64_t r, int lane, int team) {
    const uint8_t* chunk = in.chunk_of(r);
    const int64_t local = r % in.shard_rows;
    uint4* out_row = reinterpret_cast<uint4*>(out + r * in.cols);
    const float chunk_scale = kFormat == WireFormat::kMXFP8 ? 0.0f : in.decode_scale(chunk);
    const int64_t n = grid.items_per_row;  // groups (16 NVFP4 or 8 E4M3 elements), 8 code bytes each
    const uint8_t* code_row = chunk + local * in.cols / (kFormat == WireFormat::kNVFP4 ? 2 : 1);
    for (int64_t first = lane; first < n; first += team * kUnroll) {
      uint2 codes[kUnroll];  // 8 E4M3 codes, or 16 E2M1 codes
      uint8_t scale_codes[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t item = first + u * team;
        if (item >= n) break;
        codes[u] = __ldg(reinterpret_cast<const uint2*>(code_row) + item);
        if (kFormat == WireFormat::kNVFP4)
          scale_codes[u] =
              __ldg(chunk + in.scales_offset + (blocks_2d ? (local / 16) * n : local * n) + item);
        if (kFormat == WireFormat::kMXFP8)
          scale_codes[u] = __ldg(chunk + in.scales_offset + local * (in.cols / 32) + item / 4);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t item = first + u * team;
        if (item >= n) break;
        if (kFormat == WireFormat::kNVFP4) {
          uint4 group[2];
          nvfp4_decode16_bf16(codes[u], e4m3_to_float(scale_codes[u]), chunk_scale, group);
          store_group_pair(out_row, item, team >= 2 && (item | 1) < n, group);
          continue;
        }
        const float scale =
            kFormat == WireFormat::kFP8 ? chunk_scale : e8m0_to_float(scale_codes[u]);
        float v[8];
        e4m3x4_to_float(codes[u].x, v);
        e4m3x4_to_float(codes[u].y, v + 4);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] *= scale;
        out_row[item] = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                   pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
      }
    }
  });
}

template <WireFormat kFormat>
__global__ void unpack_bf16_kernel(Chunks in, uint16_t* out, RowGrid grid, bool blocks_2d) {
  unpack_bf16_rows<kFormat>(in, out, grid, blocks_2d, blockIdx.x, gridDim.x);
}

// Up to kUnpackJobsPerLaunch weights in one launch. Each job gets the blocks unpack_cuda would
// launch for it alone (blocks_for of its grid), so its rows are split among its threads exactly as
// there; a block finds its job by binary search over the per-job first blocks (prefix sums).
// The descriptors are kernel parameters (__grid_constant__: read in place from the parameter
// space, not copied to local memory for the dynamic index): no device allocation, no memcpy.
struct UnpackManyJob {
  Chunks in;
  uint16_t* out;
  RowGrid grid;
};

struct UnpackManyParams {
  int32_t jobs;
  bool blocks_2d;
  uint32_t first_block[kUnpackJobsPerLaunch + 1];  // job j owns [first_block[j], first_block[j + 1])
  UnpackManyJob job[kUnpackJobsPerLaunch];
};
// The classic kernel-parameter limit (larger needs CUDA 12.1+ drivers and costs launch time).
static_assert(sizeof(UnpackManyParams) <= 4096, "lower kUnpackJobsPerLaunch: the jobs exceed 4 KiB");
static_assert(sizeof(UnpackManyParams) + sizeof(UnpackManyJob) + 4 > 4096,
              "raise kUnpackJobsPerLaunch: another job fits the 4 KiB of kernel parameters");

template <WireFormat kFormat>
__global__ void unpack_many_bf16_kernel(const __grid_constant__ UnpackManyParams p) {
  int lo = 0, hi = p.jobs - 1;  // the last job whose first block is <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.first_block[mid] <= blockIdx.x) lo = mid; else hi = mid - 1;
  }
  const UnpackManyJob& job = p.job[lo];
  const uint32_t first = p.first_block[lo];
  unpack_bf16_rows<kFormat>(job.in, job.out, job.grid, p.blocks_2d, blockIdx.x - first,
                            p.first_block[lo + 1] - first);
}

// The GEMM layout's per-chunk FP32 decode scales (FP8, NVFP4; out == nullptr: none), copied by
// the first block of the layout's one launch rather than by a launch of their own (perf-history v23).
struct DecodeScales {
  float* out;
  int64_t count;  // G
};

__device__ __forceinline__ void copy_decode_scales(const Chunks& in, const DecodeScales& d) {
  if (blockIdx.x != 0 || d.out == nullptr) return;
  for (int64_t g = threadIdx.x; g < d.count; g += blockDim.x)
    d.out[g] = in.decode_scale(in.base + g * in.chunk_bytes);
}

// FP8 GEMM layout with the transpose. A block takes a tile of 128 rows x 128 columns: 8 threads
// a row load 16 bytes each and store them to `data` and to shared memory; then each thread reads a
// 16-row x 4-column piece as 16 words, transposes it in registers (four 4x4 byte transposes) and
// writes four 16-byte runs of transposed rows, a warp covering 128 contiguous bytes of each of 4
// transposed rows. Shared memory holds the tile row-major with each row's 16-byte groups XORed by
// the row's 16-row group, so both the row stores and the column reads are free of bank conflicts
// (the byte-wise 64x64 tile this replaces read with 4-way conflicts: ~70 % of copy, perf-history v18).
constexpr int kFp8TileRows = 128, kFp8TileCols = 128;

__global__ void __launch_bounds__(kThreads)
    unpack_fp8_gemm_transpose_kernel(Chunks in, int64_t gemm_rows, uint8_t* data, uint8_t* data_t,
                                     DecodeScales decode) {
  copy_decode_scales(in, decode);
  static_assert(kThreads == 256, "the tile walk assumes 8 threads a row and 32 rows a pass");
  __shared__ uint4 tile[kFp8TileRows][kFp8TileCols / 16];
  const int64_t tiles_c = (in.cols + kFp8TileCols - 1) / kFp8TileCols;
  const int64_t tile_r0 = (blockIdx.x / tiles_c) * kFp8TileRows;
  const int64_t tile_c0 = (blockIdx.x % tiles_c) * kFp8TileCols;
  const int group = threadIdx.x % 8;  // this thread's 16-byte group of a row
  const int64_t c = tile_c0 + group * 16;
  constexpr int kPasses = kFp8TileRows / (kThreads / 8);
  uint4 v[kPasses];
#pragma unroll
  for (int u = 0; u < kPasses; ++u) {  // all loads in flight before the first store
    const int64_t r = tile_r0 + u * (kThreads / 8) + threadIdx.x / 8;
    if (r < gemm_rows && c < in.cols)
      v[u] = __ldg(reinterpret_cast<const uint4*>(in.code_row_by_band(r, in.cols) + c));
  }
#pragma unroll
  for (int u = 0; u < kPasses; ++u) {
    const int row = u * (kThreads / 8) + threadIdx.x / 8;
    const int64_t r = tile_r0 + row;
    if (r < gemm_rows && c < in.cols) {
      *reinterpret_cast<uint4*>(data + r * in.cols + c) = v[u];
      tile[row][group ^ (row / 16)] = v[u];
    }
  }
  __syncthreads();
  // gemm_rows and cols are multiples of 16, so a piece is wholly inside the weight or outside.
  const int band = threadIdx.x % 8, word = threadIdx.x / 8;  // 16-row band, 4-column word
  const int64_t r0 = tile_r0 + 16 * band, c0 = tile_c0 + 4 * word;
  if (r0 >= gemm_rows || c0 >= in.cols) return;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  const int physical_word = ((word / 4) ^ band) * 4 + word % 4;  // the swizzle of the stores
  uint32_t m[4][4];  // m[q][i]: row 16 * band + 4q + i, columns c0 .. c0 + 3
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) m[q][i] = words[(16 * band + 4 * q + i) * 32 + physical_word];
#pragma unroll
  for (int q = 0; q < 4; ++q) transpose::bytes_4x4(m[q]);  // m[q][j]: rows 4q .. 4q+3 of c0 + j
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<uint4*>(data_t + (c0 + j) * gemm_rows + r0) =
        make_uint4(m[0][j], m[1][j], m[2][j], m[3][j]);
}

// FP8 GEMM layout without the transpose: the chunks' code rows copied 16 bytes a thread.
__global__ void unpack_fp8_gemm_rows_kernel(Chunks in, RowGrid grid, uint8_t* data, DecodeScales decode) {
  copy_decode_scales(in, decode);
  constexpr int kUnroll = 4;  // loads first, several in flight per thread
  const int64_t n = grid.items_per_row;
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    const uint4* src = reinterpret_cast<const uint4*>(in.chunk_of(r) + (r % in.shard_rows) * in.cols);
    uint4* dst = reinterpret_cast<uint4*>(data + r * in.cols);
    for (int64_t first = lane; first < n; first += team * kUnroll) {
      uint4 codes[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (first + u * team < n) codes[u] = __ldg(src + first + u * team);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (first + u * team < n) dst[first + u * team] = codes[u];
    }
  });
}

// Blocked 128x4 scales (docs/formats.md) are written as whole tiles, shared out over every warp of
// the launch after its own rows or tiles: a warp takes a 512-byte tile and lane L its 16-byte line
// L (rows L, L+32, L+64 and L+96 of the tile, 4 columns each), so each warp store covers 512
// contiguous bytes, and the latency of the scale loads overlaps other warps' streaming. Byte
// stores from the code loop wrote 4 bytes of every 32-byte sector they touched and held the
// blocked unpack at 71-89 % of copy; tiles written by extra blocks after all the code blocks ran
// alone and slower still (perf-history v22). Entries outside the matrix are written as 0, so the tile
// padding needs no memset.
struct BlockedScales {
  uint8_t* out;
  int64_t rows, cols;  // the matrix's unpadded shape
};

// Stores line_of(tile_row, c0), the calling lane's line of the tile at tile row `tile_row` and
// first column c0, into every tile of m this warp owns. The loop bounds are the same on every lane
// of a warp, so all of them reach any shuffle in line_of.
template <typename LineOf>
__device__ __forceinline__ void for_each_owned_tile(const BlockedScales& m, LineOf&& line_of) {
  constexpr int kWarps = kThreads / 32;
  const int64_t tiles_per_row = (m.cols + 3) / 4, tiles = (m.rows + 127) / 128 * tiles_per_row;
  for (int64_t t = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; t < tiles;
       t += int64_t{gridDim.x} * kWarps) {
    // 32-bit division: a scale matrix has far fewer than 2^32 tiles (each covers 512 scales).
    const uint32_t tile_row = static_cast<uint32_t>(t) / static_cast<uint32_t>(tiles_per_row);
    const int64_t c0 = (t - int64_t{tile_row} * tiles_per_row) * 4;
    reinterpret_cast<uint4*>(m.out + t * 512)[threadIdx.x % 32] = line_of(int64_t{tile_row}, c0);
  }
}

// word_at(r, c0) returns row r's scales c0 .. c0 + 3 as one word (byte j: column c0 + j), zero
// past the last column.
template <typename WordAt>
__device__ __forceinline__ void write_blocked_scales(const BlockedScales& m, WordAt&& word_at) {
  for_each_owned_tile(m, [&](int64_t tile_row, int64_t c0) {
    const int64_t r0 = tile_row * 128 + threadIdx.x % 32;
    uint32_t line[4];  // word k: row r0 + 32k
#pragma unroll
    for (int k = 0; k < 4; ++k) line[k] = r0 + 32 * k < m.rows ? word_at(r0 + 32 * k, c0) : 0u;
    return make_uint4(line[0], line[1], line[2], line[3]);
  });
}

// The same tiles for a matrix whose rows repeat in runs of 16 (NVFP4 2D blocks: `scales` repeats
// each band's row, `scales_t` each block column's): a tile's 128 rows then hold 8 distinct rows, 32
// distinct scales, so lane l loads one (row run 8 * tile row + l / 4, column c0 + l % 4) and
// shuffles assemble the lines. byte_at(q, c) reads entry c of run q. m.rows is a multiple of 16.
template <typename ByteAt>
__device__ __forceinline__ void write_run16_blocked_scales(const BlockedScales& m, ByteAt&& byte_at) {
  for_each_owned_tile(m, [&](int64_t tile_row, int64_t c0) {
    const int lane = threadIdx.x % 32;
    const int64_t q = tile_row * 8 + lane / 4, c = c0 + lane % 4;
    uint32_t word = 16 * q < m.rows && c < m.cols ? uint32_t{byte_at(q, c)} << (8 * (lane % 4)) : 0u;
    word |= __shfl_xor_sync(0xffffffffu, word, 1);  // lanes 4g .. 4g + 3: run g's word
    word |= __shfl_xor_sync(0xffffffffu, word, 2);
    uint32_t line[4];  // word k: row 32k + lane of the tile, in run 2k + lane / 16
#pragma unroll
    for (int k = 0; k < 4; ++k) line[k] = __shfl_sync(0xffffffffu, word, 4 * (2 * k + lane / 16));
    return make_uint4(line[0], line[1], line[2], line[3]);
  });
}

// Scales c0 .. c0 + 3 (c0 % 4 == 0) of a row of `per_row` scales starting at `row`, zero past its
// end: one 4-byte load when rows are whole words (chunks and their scale sections are 256-byte
// aligned), else four byte loads.
__device__ __forceinline__ uint32_t scale_word(const uint8_t* row, int64_t c0, int64_t per_row) {
  if (per_row % 4 == 0) return __ldg(reinterpret_cast<const uint32_t*>(row + c0));
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (c0 + j < per_row) word |= uint32_t{__ldg(row + c0 + j)} << (8 * j);
  return word;
}

// MXFP8 GEMM layout: a thread copies 16 codes (half a block) per item, kUnroll items per step
// with the loads first; neighbouring lanes take neighbouring items so every warp instruction
// moves 512 contiguous bytes. The even item of each block also copies the block's scale when they
// are row-major; blocked scales are written as whole tiles after the rows. Five blocks an SM keep
// the blocked path's extra registers from costing occupancy (48 registers, no spills).
__global__ void __launch_bounds__(kThreads, 5)
    unpack_mxfp8_gemm_kernel(Chunks in, RowGrid grid, uint8_t* data, uint8_t* scales, bool blocked) {
  constexpr int kUnroll = 4;
  const int64_t n = grid.items_per_row;  // cols / 16
  const int64_t blocks_per_row = n / 2;
  const bool copy_scales = !blocked;
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    const uint8_t* chunk = in.chunk_of(r);
    const int64_t local = r % in.shard_rows;
    const uint4* src = reinterpret_cast<const uint4*>(chunk + local * in.cols);
    const uint8_t* src_scales = chunk + in.scales_offset + local * blocks_per_row;
    uint4* dst = reinterpret_cast<uint4*>(data + r * in.cols);
    for (int64_t first = lane; first < n; first += team * kUnroll) {
      uint4 codes[kUnroll];
      uint8_t scale[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = first + u * team;
        if (j >= n) break;
        codes[u] = __ldg(src + j);
        if (copy_scales && j % 2 == 0) scale[u] = __ldg(src_scales + j / 2);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = first + u * team;
        if (j >= n) break;
        dst[j] = codes[u];
        if (copy_scales && j % 2 == 0) scales[r * blocks_per_row + j / 2] = scale[u];
      }
    }
  });
  if (blocked) {
    write_blocked_scales({scales, grid.rows, blocks_per_row}, [&](int64_t r, int64_t c0) {
      return scale_word(in.scale_row(r, blocks_per_row), c0, blocks_per_row);
    });
  }
}

// NVFP4 GEMM layout, 1D blocks or 2D without transpose: a thread copies the 8 code bytes (and the
// scale) of kUnroll 16-element blocks per step, loads first, so that several loads are in flight
// per thread (one 8-byte load at a time left the copy at ~45 % of the copy line). Row-major
// scales are copied in the same loop (2D blocks: by the first row of each 16-row band); blocked
// scales are written as whole tiles after the rows, 2D blocks repeated on each row of their band.
__global__ void unpack_nvfp4_gemm_kernel(Chunks in, RowGrid grid, bool blocks_2d, uint8_t* data,
                                         uint8_t* scales, bool blocked, DecodeScales decode) {
  copy_decode_scales(in, decode);
  constexpr int kUnroll = 4;
  const int64_t per_row = grid.items_per_row;
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    const uint8_t* chunk = in.chunk_of(r);
    const int64_t local = r % in.shard_rows;
    const uint2* src = reinterpret_cast<const uint2*>(chunk + (local * in.cols) / 2);
    uint2* dst = reinterpret_cast<uint2*>(data) + r * per_row;
    const bool scale_row = !blocked && (!blocks_2d || r % 16 == 0);
    const uint8_t* src_scales =
        chunk + in.scales_offset + (blocks_2d ? (local / 16) : local) * per_row;
    const int64_t scale_r = blocks_2d ? r / 16 : r;
    for (int64_t first = lane; first < per_row; first += team * kUnroll) {
      uint2 codes[kUnroll];
      uint8_t scale[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = first + u * team;
        if (j >= per_row) break;
        codes[u] = __ldg(src + j);
        if (scale_row) scale[u] = __ldg(src_scales + j);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = first + u * team;
        if (j >= per_row) break;
        dst[j] = codes[u];
        if (scale_row) scales[scale_r * per_row + j] = scale[u];
      }
    }
  });
  if (blocked && blocks_2d) {
    write_run16_blocked_scales({scales, grid.rows, per_row}, [&](int64_t band, int64_t c) {
      return __ldg(in.band_scale_row(band, per_row) + c);
    });
  } else if (blocked) {
    write_blocked_scales({scales, grid.rows, per_row}, [&](int64_t r, int64_t c0) {
      return scale_word(in.scale_row(r, per_row), c0, per_row);
    });
  }
}

// NVFP4 2D with the exact transpose, the FP8 kernel's scheme on nibbles. A block takes a tile of
// 256 rows x 256 elements (128 code bytes a row): 8 threads a row load 32 elements (16 bytes) each
// and store them to `data` and to shared memory; then each thread reads a 32-row x 8-column piece
// as 32 words, transposes it in registers (four 8x8 nibble transposes) and writes eight 16-byte
// runs, a warp covering 128 contiguous bytes of each of 4 transposed rows. A shared-memory row is
// 128 bytes; its 16-byte pieces are XORed with the row's 32-row band, which keeps the word reads (8
// bands x one piece a warp) free of bank conflicts. The 8-byte pieces of the 256 x 128 tile this
// replaces ran 2-7 points slower (perf-history v24); the per-nibble half-warp strips before it at
// ~22 % of copy (v18). Rows and columns are multiples of 16, not always of 32: then the last
// piece of a row, the last band of a column, or every odd row (16-byte alignment) moves in 8-byte
// halves. The tile's 16 x 16 block scales go to `scales` and, transposed, to `scales_t`, when they
// are row-major; blocked scales (each 2D scale repeated on its 16 rows, and on its 16 columns in
// `scales_t`) are written as whole tiles after the tile's loads and stores.
constexpr int kNvfp4TileRows = 256, kNvfp4TileCols = 256;

__global__ void __launch_bounds__(kThreads)
    unpack_nvfp4_2d_transpose_kernel(Chunks in, int64_t gemm_rows, uint8_t* data, uint8_t* scales,
                                     uint8_t* data_t, uint8_t* scales_t, bool blocked,
                                     DecodeScales decode) {
  copy_decode_scales(in, decode);
  static_assert(kThreads == 256, "the tile walk assumes 8 threads a row and 32 rows a pass");
  __shared__ uint4 tile[kNvfp4TileRows][8];
  const int64_t row_bytes = in.cols / 2, blocks_per_row = in.cols / 16, block_rows = gemm_rows / 16;
  const bool rows_aligned = row_bytes % 16 == 0, columns_aligned = gemm_rows % 32 == 0;
  const int64_t tiles_c = (in.cols + kNvfp4TileCols - 1) / kNvfp4TileCols;
  const int64_t tile_r0 = (blockIdx.x / tiles_c) * kNvfp4TileRows;
  const int64_t tile_c0 = (blockIdx.x % tiles_c) * kNvfp4TileCols;
  const int piece = threadIdx.x % 8;  // this thread's 32 elements of a row
  const int64_t c = tile_c0 + 32 * piece;
  const bool whole_piece = c + 32 <= in.cols;  // else 16 elements, or none when c >= cols
  constexpr int kPasses = kNvfp4TileRows / (kThreads / 8);
  uint4 v[kPasses];
#pragma unroll
  for (int u = 0; u < kPasses; ++u) {  // all loads in flight before the first store
    const int64_t r = tile_r0 + u * (kThreads / 8) + threadIdx.x / 8;
    if (r >= gemm_rows || c >= in.cols) continue;
    const uint8_t* p = in.code_row_by_band(r, row_bytes) + c / 2;
    if (whole_piece && rows_aligned) {
      v[u] = __ldg(reinterpret_cast<const uint4*>(p));
    } else {
      const uint2 lo = __ldg(reinterpret_cast<const uint2*>(p));
      const uint2 hi = whole_piece ? __ldg(reinterpret_cast<const uint2*>(p) + 1) : make_uint2(0, 0);
      v[u] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  // Each thread carries one of the tile's 16 x 16 row-major scales: band threadIdx.x / 16, block
  // column threadIdx.x % 16.
  const int64_t scale_band = tile_r0 / 16 + threadIdx.x / 16;
  const int64_t scale_c = tile_c0 / 16 + threadIdx.x % 16;
  const bool has_scale = !blocked && scale_band < block_rows && scale_c < blocks_per_row;
  uint8_t scale = 0;
  if (has_scale) scale = __ldg(in.band_scale_row(scale_band, blocks_per_row) + scale_c);
#pragma unroll
  for (int u = 0; u < kPasses; ++u) {
    const int row = u * (kThreads / 8) + threadIdx.x / 8;
    const int64_t r = tile_r0 + row;
    if (r >= gemm_rows || c >= in.cols) continue;
    uint8_t* p = data + r * row_bytes + c / 2;
    if (whole_piece && rows_aligned) {
      *reinterpret_cast<uint4*>(p) = v[u];
    } else {
      reinterpret_cast<uint2*>(p)[0] = make_uint2(v[u].x, v[u].y);
      if (whole_piece) reinterpret_cast<uint2*>(p)[1] = make_uint2(v[u].z, v[u].w);
    }
    tile[row][piece ^ u] = v[u];  // u is the row's 32-row band
  }
  if (has_scale) {
    scales[scale_band * blocks_per_row + scale_c] = scale;
    scales_t[scale_c * block_rows + scale_band] = scale;
  }
  if (blocked) {
    write_run16_blocked_scales({scales, gemm_rows, blocks_per_row}, [&](int64_t band, int64_t c) {
      return __ldg(in.band_scale_row(band, blocks_per_row) + c);
    });
    // scales_t: row run q is block column q, entry c the scale of band c.
    write_run16_blocked_scales({scales_t, in.cols, block_rows}, [&](int64_t q, int64_t band) {
      return __ldg(in.band_scale_row(band, blocks_per_row) + q);
    });
  }
  __syncthreads();
  // A piece is wholly inside the weight or outside in columns (cols is a multiple of 8); in rows
  // the last band may hold 16 rows, whose other 16 (never stored to the tile) are not written.
  const int band = threadIdx.x % 8, word = threadIdx.x / 8;  // 32-row band, 8-column word
  const int64_t r0 = tile_r0 + 32 * band, c0 = tile_c0 + 8 * word;
  if (r0 >= gemm_rows || c0 >= in.cols) return;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  const int physical_word = ((word / 4) ^ band) * 4 + word % 4;  // the swizzle of the stores
  uint32_t m[4][8];  // m[h][i]: row 32 * band + 8h + i, columns c0 .. c0 + 7
#pragma unroll
  for (int h = 0; h < 4; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) m[h][i] = words[(32 * band + 8 * h + i) * 32 + physical_word];
#pragma unroll
  for (int h = 0; h < 4; ++h) transpose::nibbles_8x8(m[h]);  // m[h][j]: rows 8h .. 8h+7 of c0 + j
  const bool whole_band = r0 + 32 <= gemm_rows;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint8_t* p = data_t + (c0 + j) * (gemm_rows / 2) + r0 / 2;
    if (whole_band && columns_aligned) {
      *reinterpret_cast<uint4*>(p) = make_uint4(m[0][j], m[1][j], m[2][j], m[3][j]);
    } else {
      reinterpret_cast<uint2*>(p)[0] = make_uint2(m[0][j], m[1][j]);
      if (whole_band) reinterpret_cast<uint2*>(p)[1] = make_uint2(m[2][j], m[3][j]);
    }
  }
}

Chunks chunks_of(const GatheredChunks& in, const ChunkLayout& l) {
  return Chunks{static_cast<const uint8_t*>(in.chunks), l.chunk_bytes, l.shard_rows, l.cols,
                l.scales_offset, l.scalars_offset};
}

// The BF16-layout unpack's grid of a weight: items are the kernels' groups, 16 elements for NVFP4,
// 8 otherwise (see unpack_bf16_rows).
RowGrid bf16_grid(const WireSpec& spec, int64_t rows, const ChunkLayout& l) {
  return row_grid(rows, l.cols / (spec.format == WireFormat::kNVFP4 ? 16 : 8), 4);
}

// One launch of unpack_many_bf16_kernel over jobs [begin, end) (already validated).
void launch_unpack_many(const WireSpec& spec, const UnpackJob* jobs, int64_t begin, int64_t end,
                        cudaStream_t stream) {
  UnpackManyParams p{};  // zeroed: the unused descriptors too
  p.jobs = static_cast<int32_t>(end - begin);
  p.blocks_2d = spec.nvfp4_blocks == Nvfp4Blocks::k2D;
  uint32_t blocks = 0;
  for (int64_t j = 0; j < end - begin; ++j) {
    const UnpackJob& job = jobs[begin + j];
    const ChunkLayout l = chunk_layout(spec, job.in.geometry.shard_rows, job.in.geometry.cols);
    p.job[j] = UnpackManyJob{chunks_of(job.in, l), static_cast<uint16_t*>(job.out_bf16),
                             bf16_grid(spec, job.in.geometry.rows, l)};
    p.first_block[j] = blocks;
    blocks += blocks_for(p.job[j].grid);  // at most 16 x SMs a job: the sum stays far below 2^31
  }
  p.first_block[end - begin] = blocks;
  switch (spec.format) {
    case WireFormat::kBF16:
      return;  // not reached: copied per job by unpack_many_cuda
    case WireFormat::kFP8:
      unpack_many_bf16_kernel<WireFormat::kFP8><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case WireFormat::kMXFP8:
      unpack_many_bf16_kernel<WireFormat::kMXFP8><<<blocks, kThreads, 0, stream>>>(p);
      break;
    case WireFormat::kNVFP4:
      unpack_many_bf16_kernel<WireFormat::kNVFP4><<<blocks, kThreads, 0, stream>>>(p);
      break;
  }
  check_launch("unpack_many_bf16_kernel");
}

}  // namespace

void unpack_many_cuda(const WireSpec& spec, const UnpackJob* jobs, int64_t n, cudaStream_t stream) {
  validate_unpack_many(spec, jobs, n);
  if (spec.format == WireFormat::kBF16) {  // no decode: one device copy each, as unpack_cuda
    for (int64_t j = 0; j < n; ++j)
      unpack_cuda(spec, jobs[j].in, jobs[j].out_bf16, jobs[j].out_capacity, stream);
    return;
  }
  for (int64_t begin = 0; begin < n; begin += kUnpackJobsPerLaunch)
    launch_unpack_many(spec, jobs, begin, std::min(n, begin + kUnpackJobsPerLaunch), stream);
}

void unpack_cuda(const WireSpec& spec, const GatheredChunks& in, void* out_bf16,
                 int64_t out_capacity, cudaStream_t stream) {
  const ChunkLayout l = validate_unpack(spec, in, out_bf16, out_capacity);
  const int64_t rows = in.geometry.rows;
  const RowGrid grid = bf16_grid(spec, rows, l);
  auto* out = static_cast<uint16_t*>(out_bf16);
  const Chunks c = chunks_of(in, l);
  switch (spec.format) {
    case WireFormat::kBF16:  // chunks are exactly the padded rows back to back: one copy
      check_cuda(cudaMemcpyAsync(out, in.chunks, rows * l.cols * 2, cudaMemcpyDeviceToDevice,
                                 stream),
                 "cudaMemcpyAsync(bf16 unpack)");
      return;
    case WireFormat::kFP8:
      unpack_bf16_kernel<WireFormat::kFP8><<<blocks_for(grid), kThreads, 0, stream>>>(c, out, grid,
                                                                                       false);
      break;
    case WireFormat::kMXFP8:
      unpack_bf16_kernel<WireFormat::kMXFP8><<<blocks_for(grid), kThreads, 0, stream>>>(
          c, out, grid, false);
      break;
    case WireFormat::kNVFP4:
      unpack_bf16_kernel<WireFormat::kNVFP4><<<blocks_for(grid), kThreads, 0, stream>>>(
          c, out, grid, spec.nvfp4_blocks == Nvfp4Blocks::k2D);
      break;
  }
  check_launch("unpack_bf16_kernel");
}

void unpack_gemm_cuda(const WireSpec& spec, const GatheredChunks& in, const GemmOutputs& out,
                      cudaStream_t stream) {
  const ChunkLayout l = validate_unpack_gemm(spec, in, out);
  const GemmLayoutSizes sizes = gemm_layout_sizes(spec, in.geometry, out.scale_layout);
  const Chunks c = chunks_of(in, l);
  auto* data = static_cast<uint8_t*>(out.data);
  auto* scales = static_cast<uint8_t*>(out.scales);
  auto* data_t = static_cast<uint8_t*>(out.transposed_data);
  const int64_t rows = sizes.gemm_rows;
  const bool blocked = out.scale_layout == ScaleLayout::kBlocked128x4;
  const DecodeScales decode{sizes.decode_scale_count > 0 ? out.decode_scales : nullptr,
                            sizes.decode_scale_count};
  switch (spec.format) {
    case WireFormat::kBF16:
      return;  // refused by validate_unpack_gemm
    case WireFormat::kFP8: {
      if (data_t == nullptr) {
        const RowGrid grid = row_grid(rows, l.cols / 16, 4);
        unpack_fp8_gemm_rows_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(c, grid, data, decode);
        check_launch("unpack_fp8_gemm_rows_kernel");
        break;
      }
      const unsigned tiles = static_cast<unsigned>(((rows + kFp8TileRows - 1) / kFp8TileRows) *
                                                   ((l.cols + kFp8TileCols - 1) / kFp8TileCols));
      unpack_fp8_gemm_transpose_kernel<<<tiles, kThreads, 0, stream>>>(c, rows, data, data_t, decode);
      check_launch("unpack_fp8_gemm_transpose_kernel");
      break;
    }
    case WireFormat::kMXFP8: {
      const RowGrid grid = row_grid(rows, l.cols / 16, 4);
      unpack_mxfp8_gemm_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(c, grid, data, scales,
                                                                          blocked);
      check_launch("unpack_mxfp8_gemm_kernel");
      break;
    }
    case WireFormat::kNVFP4:
      if (data_t != nullptr) {
        const unsigned tiles =
            static_cast<unsigned>(((rows + kNvfp4TileRows - 1) / kNvfp4TileRows) *
                                  ((l.cols + kNvfp4TileCols - 1) / kNvfp4TileCols));
        unpack_nvfp4_2d_transpose_kernel<<<tiles, kThreads, 0, stream>>>(
            c, rows, data, scales, data_t, static_cast<uint8_t*>(out.transposed_scales), blocked,
            decode);
        check_launch("unpack_nvfp4_2d_transpose_kernel");
      } else {
        const RowGrid grid = row_grid(rows, l.cols / 16, 4);
        unpack_nvfp4_gemm_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(
            c, grid, spec.nvfp4_blocks == Nvfp4Blocks::k2D, data, scales, blocked, decode);
        check_launch("unpack_nvfp4_gemm_kernel");
      }
      break;
  }
}

}  // namespace gtp::kernels

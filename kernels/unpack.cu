// Unpack kernels: gathered chunks -> the BF16 weight, or the GEMM-ready layout. Each pass maps
// output rows to (chunk, local row), which de-interleaves the chunks and strips the padding, and
// moves the block scales into whole-weight arrays in the same pass.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_kernels.h"
#include "kernels/internal/device_io.cuh"

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
// the L2 write traffic (ncu, v7 in perf-notes). NVFP4 groups are 16 elements, one block, decoded
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

__global__ void copy_decode_scales_kernel(Chunks in, int64_t group_size, float* decode_scales) {
  for (int64_t g = threadIdx.x; g < group_size; g += blockDim.x)
    decode_scales[g] = in.decode_scale(in.base + g * in.chunk_bytes);
}

// FP8 GEMM layout with the transpose: 64x64-byte tiles, copied row-major and transposed through
// shared memory so both outputs are written with 16-byte stores.
__global__ void unpack_fp8_gemm_kernel(Chunks in, int64_t gemm_rows, uint8_t* data,
                                       uint8_t* data_t) {
  __shared__ __align__(16) uint8_t tile[64][80];  // 16 bytes of row padding spreads the banks
  const int64_t tiles_c = (in.cols + 63) / 64;
  const int64_t tile_r0 = (blockIdx.x / tiles_c) * 64, tile_c0 = (blockIdx.x % tiles_c) * 64;
  const int row = threadIdx.x / 4, segment = threadIdx.x % 4;
  const int64_t r = tile_r0 + row, c = tile_c0 + segment * 16;
  if (r < gemm_rows && c < in.cols) {
    const uint4 v = __ldg(
        reinterpret_cast<const uint4*>(in.chunk_of(r) + (r % in.shard_rows) * in.cols + c));
    *reinterpret_cast<uint4*>(data + r * in.cols + c) = v;
    *reinterpret_cast<uint4*>(&tile[row][segment * 16]) = v;
  }
  __syncthreads();
  // Thread -> (output row = weight column, 16 consecutive weight rows).
  const int col = threadIdx.x / 4;
  const int64_t tc = tile_c0 + col, tr = tile_r0 + segment * 16;
  if (tc < in.cols && tr < gemm_rows) {
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      words[w] = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        words[w] |= static_cast<uint32_t>(tile[segment * 16 + w * 4 + k][col]) << (8 * k);
    }
    *reinterpret_cast<uint4*>(data_t + tc * gemm_rows + tr) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// FP8 GEMM layout without the transpose: the chunks' code rows copied 16 bytes a thread.
__global__ void unpack_fp8_gemm_rows_kernel(Chunks in, RowGrid grid, uint8_t* data) {
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

// MXFP8 GEMM layout: a thread copies 16 codes (half a block) per item, kUnroll items per step
// with the loads first; neighbouring lanes take neighbouring items so every warp instruction
// moves 512 contiguous bytes. The even item of each block also copies the block's scale.
__global__ void unpack_mxfp8_gemm_kernel(Chunks in, RowGrid grid, uint8_t* data, uint8_t* scales) {
  constexpr int kUnroll = 4;
  const int64_t n = grid.items_per_row;  // cols / 16
  const int64_t blocks_per_row = n / 2;
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
        if (j % 2 == 0) scale[u] = __ldg(src_scales + j / 2);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = first + u * team;
        if (j >= n) break;
        dst[j] = codes[u];
        if (j % 2 == 0) scales[r * blocks_per_row + j / 2] = scale[u];
      }
    }
  });
}

// NVFP4 GEMM layout, 1D blocks or 2D without transpose: a thread copies the 8 code bytes (and the
// scale) of kUnroll 16-element blocks per step, loads first, so that several loads are in flight
// per thread (one 8-byte load at a time left the copy at ~45 % of the copy line).
__global__ void unpack_nvfp4_gemm_kernel(Chunks in, RowGrid grid, bool blocks_2d, uint8_t* data,
                                         uint8_t* scales) {
  constexpr int kUnroll = 4;
  const int64_t per_row = grid.items_per_row;
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    const uint8_t* chunk = in.chunk_of(r);
    const int64_t local = r % in.shard_rows;
    const uint2* src = reinterpret_cast<const uint2*>(chunk + (local * in.cols) / 2);
    uint2* dst = reinterpret_cast<uint2*>(data) + r * per_row;
    // 2D blocks: the first row of each 16-row band carries the band's scales.
    const bool scale_row = !blocks_2d || r % 16 == 0;
    const uint8_t* src_scales =
        chunk + in.scales_offset + (blocks_2d ? (local / 16) : local) * per_row;
    uint8_t* dst_scales = scales + (blocks_2d ? r / 16 : r) * per_row;
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
        if (scale_row) dst_scales[j] = scale[u];
      }
    }
  });
}

// NVFP4 2D with the exact transpose. A half-warp takes a strip of up to four vertically adjacent
// 16x16 tiles (64 rows x 16 columns); lane i holds rows i, i+16, i+32, i+48. The nibbles go
// through shared memory so that lane j then writes column j of the strip as one run of up to 32
// contiguous bytes of transposed row j (a full sector), not four scattered 8-byte pieces.
constexpr int kStripTiles = 4;

__global__ void unpack_nvfp4_2d_transpose_kernel(Chunks in, int64_t gemm_rows, uint8_t* data,
                                                 uint8_t* scales, uint8_t* data_t,
                                                 uint8_t* scales_t) {
  __shared__ uint8_t nibbles[kThreads / 16][kStripTiles * 16][17];
  const int64_t tiles_per_row = in.cols / 16;
  const int64_t tile_rows = gemm_rows / 16;
  const int64_t strips = (tile_rows + kStripTiles - 1) / kStripTiles;
  const int64_t work = strips * tiles_per_row;
  const int half_warp = threadIdx.x / 16, lane = threadIdx.x % 16;
  const unsigned half_mask = 0xffffu << (16 * (half_warp % 2));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / 16;
  // All 16 lanes of a half-warp share the loop bound, so __syncwarp sees them all.
  for (int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 16;
       item < work; item += stride) {
    const int64_t strip = item / tiles_per_row, tc = item % tiles_per_row;
    const int64_t tr0 = strip * kStripTiles;
    const int tiles = static_cast<int>(tile_rows - tr0 < kStripTiles ? tile_rows - tr0 : kStripTiles);
    const int64_t c = tc * 16;
    for (int t = 0; t < tiles; ++t) {
      const int64_t r = (tr0 + t) * 16 + lane;
      const uint8_t* chunk = in.chunk_of(r);
      const int64_t local = r % in.shard_rows;
      const uint2 codes = __ldg(reinterpret_cast<const uint2*>(chunk + (local * in.cols + c) / 2));
      *reinterpret_cast<uint2*>(data + (r * in.cols + c) / 2) = codes;
      if (lane == 0) {
        const uint8_t s = __ldg(chunk + in.scales_offset + (local / 16) * tiles_per_row + tc);
        scales[(tr0 + t) * tiles_per_row + tc] = s;
        scales_t[tc * tile_rows + tr0 + t] = s;
      }
      const uint32_t words[2] = {codes.x, codes.y};
#pragma unroll
      for (int k = 0; k < 16; ++k)
        nibbles[half_warp][t * 16 + lane][k] =
            static_cast<uint8_t>((words[k / 8] >> (4 * (k % 8))) & 0xf);
    }
    __syncwarp(half_mask);
    // Column `lane` of the strip: 16 rows per tile, two nibbles a byte, 8 bytes a tile.
    uint2* out = reinterpret_cast<uint2*>(data_t + (c + lane) * (gemm_rows / 2) + tr0 * 8);
    for (int t = 0; t < tiles; ++t) {
      uint32_t packed[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 16; ++k)
        packed[k / 8] |= static_cast<uint32_t>(nibbles[half_warp][t * 16 + k][lane]) << (4 * (k % 8));
      out[t] = make_uint2(packed[0], packed[1]);
    }
    __syncwarp(half_mask);
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
  const GemmLayoutSizes sizes = gemm_layout_sizes(spec, in.geometry);
  const Chunks c = chunks_of(in, l);
  auto* data = static_cast<uint8_t*>(out.data);
  auto* scales = static_cast<uint8_t*>(out.scales);
  auto* data_t = static_cast<uint8_t*>(out.transposed_data);
  const int64_t rows = sizes.gemm_rows;
  switch (spec.format) {
    case WireFormat::kBF16:
      return;  // refused by validate_unpack_gemm
    case WireFormat::kFP8: {
      if (data_t == nullptr) {
        const RowGrid grid = row_grid(rows, l.cols / 16, 4);
        unpack_fp8_gemm_rows_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(c, grid, data);
        check_launch("unpack_fp8_gemm_rows_kernel");
        break;
      }
      const unsigned tiles = static_cast<unsigned>(((rows + 63) / 64) * ((l.cols + 63) / 64));
      unpack_fp8_gemm_kernel<<<tiles, kThreads, 0, stream>>>(c, rows, data, data_t);
      check_launch("unpack_fp8_gemm_kernel");
      break;
    }
    case WireFormat::kMXFP8:
    {
      const RowGrid grid = row_grid(rows, l.cols / 16, 4);
      unpack_mxfp8_gemm_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(c, grid, data, scales);
    }
      check_launch("unpack_mxfp8_gemm_kernel");
      break;
    case WireFormat::kNVFP4:
      if (data_t != nullptr) {
        unpack_nvfp4_2d_transpose_kernel<<<grid_for(rows * l.cols / 16 / kStripTiles), kThreads, 0,
                                           stream>>>(
            c, rows, data, scales, data_t, static_cast<uint8_t*>(out.transposed_scales));
        check_launch("unpack_nvfp4_2d_transpose_kernel");
      } else {
        const RowGrid grid = row_grid(rows, l.cols / 16, 4);
        unpack_nvfp4_gemm_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(
            c, grid, spec.nvfp4_blocks == Nvfp4Blocks::k2D, data, scales);
        check_launch("unpack_nvfp4_gemm_kernel");
      }
      break;
  }
  if (sizes.decode_scale_count > 0) {
    copy_decode_scales_kernel<<<1, kThreads, 0, stream>>>(c, sizes.decode_scale_count,
                                                          out.decode_scales);
    check_launch("copy_decode_scales_kernel");
  }
}

}  // namespace gtp::kernels

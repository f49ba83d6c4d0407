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

// One thread per 32-element block of a row.
__global__ void pack_mxfp8_kernel(Source src, uint8_t* data, uint8_t* scales, RowGrid grid,
                                  bool rceil, ChunkPadding pad) {
  write_padding(pad);
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    for (int64_t b = lane; b < grid.items_per_row; b += team) {
      const int64_t c = b * 32;
      float v[32];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        load8(src, r, c + 8 * k, *reinterpret_cast<float(*)[8]>(v + 8 * k));
      // Integer max of the magnitude bits: NaN > Inf > finite, so it also flags the block.
      uint32_t top = 0;
#pragma unroll
      for (int k = 0; k < 32; ++k) top = max(top, __float_as_uint(v[k]) & 0x7fffffffu);
      const bool non_finite = top >= 0x7f800000u;
      const float amax = __uint_as_float(top);
      const uint8_t e = non_finite ? kE8M0NaN : (rceil ? e8m0_rceil(amax) : e8m0_floor(amax));
      const float multiplier = mx_encode_multiplier(e, rceil);
      uint4 out[2];
      uint32_t* words = reinterpret_cast<uint32_t*>(out);
#pragma unroll
      for (int k = 0; k < 8; ++k) words[k] = non_finite ? 0u : e4m3x4(v + 4 * k, multiplier);
      uint4* dst = reinterpret_cast<uint4*>(data + r * src.cols + c);
      dst[0] = out[0];
      dst[1] = out[1];
      scales[r * grid.items_per_row + b] = e;
    }
  });
}

// 16 elements of one NVFP4 block -> 8 bytes of codes, element 2k in the low nibble of byte k.
__device__ __forceinline__ uint2 encode_e2m1x16(const float* v, float multiplier, bool zero) {
  uint32_t words[2] = {0u, 0u};
  if (!zero) {
#pragma unroll
    for (int k = 0; k < 16; ++k)
      words[k / 8] |= e2m1_code(v[k] * multiplier) << (4 * (k % 8));
  }
  return make_uint2(words[0], words[1]);
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

// c = min(1 / (s_b * S_dec), FLT_MAX) (codec::nvfp4_element_multiplier); rcp.rn is exactly 1/x.
__device__ __forceinline__ float nvfp4_multiplier(uint8_t scale, float decode) {
  return fminf(__frcp_rn(e4m3_to_float(scale) * decode), kFloatMax);
}

// 1D blocks: one thread per 16-element block of a row.
__global__ void pack_nvfp4_1d_kernel(Source src, uint8_t* data, uint8_t* scales, RowGrid grid,
                                     const float* amax_in, float* scalars, ChunkPadding pad) {
  write_padding(pad);
  float encode, decode;
  nvfp4_global_scales(amax_in, &encode, &decode);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[kDecodeScale] = decode;
    scalars[kAmax] = sanitize_amax(*amax_in);
  }
  for_each_row(grid, [&](int64_t r, int lane, int team) {
    for (int64_t b = lane; b < grid.items_per_row; b += team) {
      float v[16];
      load8(src, r, b * 16, *reinterpret_cast<float(*)[8]>(v));
      load8(src, r, b * 16 + 8, *reinterpret_cast<float(*)[8]>(v + 8));
      // Largest magnitude by integer max of the bit patterns: NaN > Inf > every finite value,
      // so one compare per element also tells whether the block is finite.
      uint32_t top = 0;
#pragma unroll
      for (int k = 0; k < 16; ++k) top = max(top, __float_as_uint(v[k]) & 0x7fffffffu);
      const bool non_finite = top >= 0x7f800000u;
      const uint8_t scale = nvfp4_block_scale_code(top, encode);
      const float multiplier = nvfp4_multiplier(scale, decode);
      const int64_t index = r * grid.items_per_row + b;
      reinterpret_cast<uint2*>(data)[index] = encode_e2m1x16(v, multiplier, non_finite);
      scales[index] = scale;
    }
  });
}

// 2D blocks: a half-warp per 16x16 tile, one lane per row; the tile amax is a 16-lane reduction.
// Whole warps walk the grid together so every shuffle has all 32 lanes.
__global__ void pack_nvfp4_2d_kernel(Source src, uint8_t* data, uint8_t* scales, int64_t rows,
                                     const float* amax_in, float* scalars, ChunkPadding pad) {
  write_padding(pad);
  float encode, decode;
  nvfp4_global_scales(amax_in, &encode, &decode);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scalars[kDecodeScale] = decode;
    scalars[kAmax] = sanitize_amax(*amax_in);
  }
  const int64_t tiles_per_row = src.cols / 16;
  const int64_t tiles = (rows / 16) * tiles_per_row;
  const int lane = threadIdx.x % 32, half = lane / 16, row_in_tile = lane % 16;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t pair = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       pair * 2 < tiles; pair += warps) {
    const int64_t tile = pair * 2 + half;
    const bool active = tile < tiles;
    const int64_t r = active ? (tile / tiles_per_row) * 16 + row_in_tile : 0;
    const int64_t c = active ? (tile % tiles_per_row) * 16 : 0;
    float v[16];
    if (active) {
      load8(src, r, c, *reinterpret_cast<float(*)[8]>(v));
      load8(src, r, c + 8, *reinterpret_cast<float(*)[8]>(v + 8));
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = 0.0f;
    }
    // Integer max of the magnitude bits over the tile (NaN > Inf > finite), see the 1D kernel.
    uint32_t top = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) top = max(top, __float_as_uint(v[k]) & 0x7fffffffu);
    for (int offset = 8; offset > 0; offset /= 2) top = max(top, __shfl_xor_sync(~0u, top, offset));
    if (!active) continue;
    const bool non_finite = top >= 0x7f800000u;
    const uint8_t scale = nvfp4_block_scale_code(top, encode);
    const float multiplier = nvfp4_multiplier(scale, decode);
    *reinterpret_cast<uint2*>(data + (r * src.cols + c) / 2) =
        encode_e2m1x16(v, multiplier, non_finite);
    if (row_in_tile == 0) scales[tile] = scale;
  }
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
  const int64_t elements = rows * l.cols;
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
      pack_mxfp8_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(
          src, data, scales, grid, spec.mx_rounding == ScaleRounding::kRceil, pad);
      check_launch("pack_mxfp8_kernel");
      break;
    }
    case WireFormat::kNVFP4:
      if (spec.nvfp4_blocks == Nvfp4Blocks::k1D) {
        const RowGrid grid = row_grid(rows, l.cols / 16);
        pack_nvfp4_1d_kernel<<<blocks_for(grid), kThreads, 0, stream>>>(
            src, data, scales, grid, amax, scalars, pad);
        check_launch("pack_nvfp4_1d_kernel");
      } else {
        pack_nvfp4_2d_kernel<<<grid_for(elements / 16), kThreads, 0, stream>>>(
            src, data, scales, rows, amax, scalars, pad);
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

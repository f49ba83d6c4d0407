#include "kernels/reference.h"

#include <cstring>

#include "kernels/codecs.h"
#include "kernels/scale_layout.h"

namespace gtp::kernels {
namespace {

using namespace codec;

// Element (r, c) of the source as FP32; rows at or past `valid_rows` are zero padding.
class SourceReader {
 public:
  SourceReader(const void* src, SourceDtype dtype, int64_t valid_rows, int64_t cols)
      : src_(src), dtype_(dtype), valid_rows_(valid_rows), cols_(cols) {}
  float operator()(int64_t r, int64_t c) const {
    if (r >= valid_rows_) return 0.0f;
    const int64_t i = r * cols_ + c;
    if (dtype_ == SourceDtype::kBF16) {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(src_) + 2 * i, 2);
      return bf16_to_float(h);
    }
    float f;
    std::memcpy(&f, static_cast<const uint8_t*>(src_) + 4 * i, 4);
    return f;
  }

 private:
  const void* src_;
  SourceDtype dtype_;
  int64_t valid_rows_;
  int64_t cols_;
};

float sanitized_amax(const float* given, const SourceReader& read, int64_t rows, int64_t cols) {
  if (given == nullptr) {
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float x = read(r, c);
        if (is_finite(x)) amax = max_value(amax, abs_value(x));
      }
    return amax;
  }
  const float a = *given;
  return (is_finite(a) && a > 0.0f) ? a : 0.0f;
}

void store_bf16(uint8_t* base, int64_t index, uint16_t value) {
  std::memcpy(base + 2 * index, &value, 2);
}

void write_scalars(uint8_t* chunk, const ChunkLayout& layout, float decode_scale, float amax) {
  float scalars[kChunkScalarCount] = {};
  scalars[kDecodeScale] = decode_scale;
  scalars[kAmax] = amax;
  std::memcpy(chunk + layout.scalars_offset, scalars, sizeof scalars);
}

float read_scalar(const uint8_t* chunk, const ChunkLayout& layout, ChunkScalar which) {
  float value;
  std::memcpy(&value, chunk + layout.scalars_offset + which * sizeof(float), sizeof value);
  return value;
}

// Block amax over finite elements, and whether any element is NaN or infinite.
struct BlockStats {
  float amax = 0.0f;
  bool non_finite = false;
  void add(float x) {
    if (is_finite(x)) amax = max_value(amax, abs_value(x));
    else non_finite = true;
  }
};

void set_nibble(uint8_t* row, int64_t index, uint8_t code) {
  uint8_t& byte = row[index / 2];
  byte = (index & 1) ? static_cast<uint8_t>((byte & 0x0f) | (code << 4))
                     : static_cast<uint8_t>((byte & 0xf0) | code);
}

uint8_t get_nibble(const uint8_t* row, int64_t index) {
  return (index & 1) ? row[index / 2] >> 4 : row[index / 2] & 0x0f;
}

void pack_mxfp8(const WireSpec& spec, const SourceReader& read, const ChunkLayout& l,
                uint8_t* chunk) {
  uint8_t* data = chunk + l.data_offset;
  uint8_t* scales = chunk + l.scales_offset;
  const bool rceil = spec.mx_rounding == ScaleRounding::kRceil;
  for (int64_t r = 0; r < l.shard_rows; ++r) {
    for (int64_t b = 0; b < l.scales_per_row; ++b) {
      BlockStats stats;
      for (int64_t k = 0; k < 32; ++k) stats.add(read(r, b * 32 + k));
      const uint8_t e = stats.non_finite ? kE8M0NaN
                        : rceil          ? e8m0_rceil(stats.amax)
                                         : e8m0_floor(stats.amax);
      scales[r * l.scales_per_row + b] = e;
      const float multiplier = mx_encode_multiplier(e, rceil);
      for (int64_t k = 0; k < 32; ++k) {
        const int64_t c = b * 32 + k;
        data[r * l.cols + c] = stats.non_finite ? 0 : float_to_e4m3(read(r, c) * multiplier);
      }
    }
  }
}

// NVFP4 over blocks of `block_rows` x 16 (1 for 1D, 16 for 2D).
void pack_nvfp4(const WireSpec& spec, const SourceReader& read, const ChunkLayout& l,
                float encode_scale, float decode_scale, uint8_t* chunk) {
  uint8_t* data = chunk + l.data_offset;
  uint8_t* scales = chunk + l.scales_offset;
  const int64_t block_rows = spec.nvfp4_blocks == Nvfp4Blocks::k2D ? 16 : 1;
  const int64_t blocks_per_row = l.cols / 16;
  for (int64_t br = 0; br < l.shard_rows / block_rows; ++br) {
    for (int64_t bc = 0; bc < blocks_per_row; ++bc) {
      BlockStats stats;
      for (int64_t r = br * block_rows; r < (br + 1) * block_rows; ++r)
        for (int64_t c = bc * 16; c < bc * 16 + 16; ++c) stats.add(read(r, c));
      const uint8_t scale =
          stats.non_finite ? kE4M3NaN : nvfp4_block_scale(stats.amax, encode_scale);
      scales[br * blocks_per_row + bc] = scale;
      const float multiplier = nvfp4_element_multiplier(scale, decode_scale);
      for (int64_t r = br * block_rows; r < (br + 1) * block_rows; ++r)
        for (int64_t c = bc * 16; c < bc * 16 + 16; ++c)
          set_nibble(data + r * (l.cols / 2), c,
                     stats.non_finite ? 0 : float_to_e2m1(read(r, c) * multiplier));
    }
  }
}

// Value (r, c) of chunk-local row `r` decoded to FP32.
float decode_element(const WireSpec& spec, const ChunkLayout& l, const uint8_t* chunk, int64_t r,
                     int64_t c) {
  const uint8_t* data = chunk + l.data_offset;
  const uint8_t* scales = chunk + l.scales_offset;
  switch (spec.format) {
    case WireFormat::kBF16:
      break;
    case WireFormat::kFP8:
      return e4m3_to_float(data[r * l.cols + c]) * read_scalar(chunk, l, kDecodeScale);
    case WireFormat::kMXFP8:
      return e4m3_to_float(data[r * l.cols + c]) *
             e8m0_to_float(scales[r * l.scales_per_row + c / 32]);
    case WireFormat::kNVFP4: {
      const uint8_t code = get_nibble(data + r * (l.cols / 2), c);
      const uint8_t scale = spec.nvfp4_blocks == Nvfp4Blocks::k1D
                                ? scales[r * l.scales_per_row + c / 16]
                                : scales[(r / 16) * (l.cols / 16) + c / 16];
      return nvfp4_decode(code, scale, read_scalar(chunk, l, kDecodeScale));
    }
  }
  return 0.0f;
}

}  // namespace

float amax_reference(const void* src, SourceDtype dtype, int64_t rows, int64_t cols) {
  float amax_out = 0.0f;
  validate_amax_input(src, dtype, rows, cols, &amax_out);
  return sanitized_amax(nullptr, SourceReader(src, dtype, rows, cols), rows, cols);
}

void pack_reference(const WireSpec& spec, const PackArgs& args) {
  const ChunkLayout l = validate_pack(spec, args);
  auto* chunk = static_cast<uint8_t*>(args.chunk);
  std::memset(chunk, 0, l.chunk_bytes);
  const SourceReader read(args.shard, args.src_dtype, args.valid_rows, args.cols);
  switch (spec.format) {
    case WireFormat::kBF16:
      if (args.src_dtype == SourceDtype::kBF16) {  // passthrough, bit for bit
        if (args.valid_rows > 0)
          std::memcpy(chunk + l.data_offset, args.shard, args.valid_rows * l.cols * 2);
      } else {
        for (int64_t r = 0; r < args.valid_rows; ++r)
          for (int64_t c = 0; c < l.cols; ++c)
            store_bf16(chunk + l.data_offset, r * l.cols + c, float_to_bf16(read(r, c)));
      }
      break;
    case WireFormat::kFP8: {
      const float amax = sanitized_amax(args.amax, read, args.valid_rows, args.cols);
      const float scale = fp8_encode_scale(amax);
      for (int64_t r = 0; r < l.shard_rows; ++r)
        for (int64_t c = 0; c < l.cols; ++c)
          chunk[l.data_offset + r * l.cols + c] = float_to_e4m3(read(r, c) * scale);
      write_scalars(chunk, l, 1.0f / scale, amax);
      break;
    }
    case WireFormat::kMXFP8:
      pack_mxfp8(spec, read, l, chunk);
      break;
    case WireFormat::kNVFP4: {
      const float amax = sanitized_amax(args.amax, read, args.valid_rows, args.cols);
      const float encode_scale = nvfp4_encode_scale(amax);
      const float decode_scale = 1.0f / encode_scale;
      pack_nvfp4(spec, read, l, encode_scale, decode_scale, chunk);
      write_scalars(chunk, l, decode_scale, amax);
      break;
    }
  }
}

void unpack_reference(const WireSpec& spec, const GatheredChunks& in, void* out_bf16,
                      int64_t out_capacity) {
  const ChunkLayout l = validate_unpack(spec, in, out_bf16, out_capacity);
  const auto* chunks = static_cast<const uint8_t*>(in.chunks);
  auto* out = static_cast<uint8_t*>(out_bf16);
  for (int64_t r = 0; r < in.geometry.rows; ++r) {
    const uint8_t* chunk = chunks + (r / l.shard_rows) * l.chunk_bytes;
    for (int64_t c = 0; c < l.cols; ++c) {
      // BF16 wire is passed through bit for bit (NaN payloads included).
      uint16_t h;
      if (spec.format == WireFormat::kBF16) {
        std::memcpy(&h, chunk + l.data_offset + 2 * ((r % l.shard_rows) * l.cols + c), 2);
      } else {
        h = float_to_bf16(decode_element(spec, l, chunk, r % l.shard_rows, c));
      }
      store_bf16(out, r * l.cols + c, h);
    }
  }
}

void unpack_many_reference(const WireSpec& spec, const UnpackJob* jobs, int64_t n) {
  validate_unpack_many(spec, jobs, n);  // every job first: a bad one leaves all outputs untouched
  for (int64_t i = 0; i < n; ++i)
    unpack_reference(spec, jobs[i].in, jobs[i].out_bf16, jobs[i].out_capacity);
}

void unpack_gemm_reference(const WireSpec& spec, const GatheredChunks& in,
                           const GemmOutputs& out) {
  const ChunkLayout l = validate_unpack_gemm(spec, in, out);
  const GemmLayoutSizes sizes = gemm_layout_sizes(spec, in.geometry, out.scale_layout);
  const auto* chunks = static_cast<const uint8_t*>(in.chunks);
  const int64_t rows = sizes.gemm_rows;
  const int64_t cols = l.cols;
  auto* data = static_cast<uint8_t*>(out.data);
  auto* scales = static_cast<uint8_t*>(out.scales);
  auto* data_t = static_cast<uint8_t*>(out.transposed_data);
  auto* scales_t = static_cast<uint8_t*>(out.transposed_scales);
  const bool nvfp4 = spec.format == WireFormat::kNVFP4;
  const bool blocks_2d = nvfp4 && spec.nvfp4_blocks == Nvfp4Blocks::k2D;
  const bool blocked = out.scale_layout == ScaleLayout::kBlocked128x4;
  if (data_t != nullptr && nvfp4) std::memset(data_t, 0, sizes.transposed_data_bytes);
  // Blocked scales are whole tiles: the entries past the matrix are zero.
  if (blocked && scales != nullptr) std::memset(scales, 0, sizes.scales_bytes);
  if (blocked && data_t != nullptr && scales_t != nullptr) std::memset(scales_t, 0, sizes.transposed_scales_bytes);
  // The scale of 16x16 tile (band, tile_col): held by the chunk of the band's rows.
  auto tile_scale = [&](int64_t band, int64_t tile_col) {
    const int64_t r = band * 16;
    const uint8_t* chunk = chunks + (r / l.shard_rows) * l.chunk_bytes;
    return chunk[l.scales_offset + ((r % l.shard_rows) / 16) * (cols / 16) + tile_col];
  };

  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* chunk = chunks + (r / l.shard_rows) * l.chunk_bytes;
    const int64_t local = r % l.shard_rows;
    const int64_t row_bytes = nvfp4 ? cols / 2 : cols;
    std::memcpy(data + r * row_bytes, chunk + l.data_offset + local * row_bytes, row_bytes);
    for (int64_t c = 0; c < l.scales_per_row; ++c) {
      scales[scale_offset(blocked, r, c, sizes.scale_cols)] = chunk[l.scales_offset + local * l.scales_per_row + c];
    }
    // 2D: a scale row per 16-row band, or (blocked) the band's scales on every row.
    if (blocks_2d && (blocked || r % 16 == 0)) {
      for (int64_t c = 0; c < cols / 16; ++c) {
        scales[scale_offset(blocked, blocked ? r : r / 16, c, sizes.scale_cols)] = tile_scale(r / 16, c);
      }
    }
    if (data_t == nullptr) continue;
    for (int64_t c = 0; c < cols; ++c) {
      if (nvfp4) {
        set_nibble(data_t + c * (rows / 2), r, get_nibble(data + r * row_bytes, c));
      } else {
        data_t[c * rows + r] = data[r * cols + c];
      }
    }
  }
  if (data_t != nullptr && blocks_2d) {
    // The transpose's scale matrix: row c (a weight column) of band br holds tile (br, c / 16).
    for (int64_t tr = 0; tr < sizes.transposed_scale_rows; ++tr) {
      for (int64_t br = 0; br < rows / 16; ++br) {
        scales_t[scale_offset(blocked, tr, br, sizes.transposed_scale_cols)] = tile_scale(br, blocked ? tr / 16 : tr);
      }
    }
  }
  for (int64_t g = 0; g < sizes.decode_scale_count; ++g) {
    out.decode_scales[g] = read_scalar(chunks + g * l.chunk_bytes, l, kDecodeScale);
  }
}

}  // namespace gtp::kernels

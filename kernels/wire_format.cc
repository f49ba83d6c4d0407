#include "kernels/wire_format.h"

#include <stdexcept>

namespace gtp::kernels {

std::string to_string(WireFormat format) {
  switch (format) {
    case WireFormat::kBF16: return "bf16";
    case WireFormat::kFP8: return "fp8";
    case WireFormat::kMXFP8: return "mxfp8";
    case WireFormat::kNVFP4: return "nvfp4";
  }
  return "wire format #" + std::to_string(static_cast<int>(format));
}

std::string to_string(ScaleRounding rounding) {
  return rounding == ScaleRounding::kRceil ? "rceil" : "floor";
}

std::string to_string(Nvfp4Blocks blocks) { return blocks == Nvfp4Blocks::k1D ? "1d" : "2d"; }

std::string to_string(const WireSpec& spec) {
  if (spec.format == WireFormat::kMXFP8) return "mxfp8 (" + to_string(spec.mx_rounding) + ")";
  if (spec.format == WireFormat::kNVFP4) return "nvfp4 (" + to_string(spec.nvfp4_blocks) + ")";
  return to_string(spec.format);
}

std::string to_string(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::kRowMajor: return "row-major";
    case ScaleLayout::kBlocked128x4: return "blocked 128x4";
  }
  return "unknown scale layout " + std::to_string(static_cast<int>(layout));
}

std::string to_string(SourceDtype dtype) { return dtype == SourceDtype::kBF16 ? "bf16" : "fp32"; }

WireFormat parse_wire_format(const std::string& name) {
  if (name == "bf16") return WireFormat::kBF16;
  if (name == "fp8") return WireFormat::kFP8;
  if (name == "mxfp8") return WireFormat::kMXFP8;
  if (name == "nvfp4") return WireFormat::kNVFP4;
  throw std::invalid_argument("unknown wire format \"" + name +
                              "\": use one of bf16, fp8, mxfp8, nvfp4");
}

static void check_known(WireFormat format) {
  switch (format) {
    case WireFormat::kBF16:
    case WireFormat::kFP8:
    case WireFormat::kMXFP8:
    case WireFormat::kNVFP4:
      return;
  }
  throw std::invalid_argument("unknown wire format value " +
                              std::to_string(static_cast<int>(format)) +
                              ": use WireFormat::kBF16, kFP8, kMXFP8 or kNVFP4");
}

int64_t row_alignment(WireFormat format) {
  check_known(format);
  return format == WireFormat::kMXFP8 ? 32 : 16;
}

int64_t block_width(WireFormat format) {
  check_known(format);
  if (format == WireFormat::kMXFP8) return 32;
  if (format == WireFormat::kNVFP4) return 16;
  return 0;
}

int64_t column_multiple(WireFormat format) {
  const int64_t block = block_width(format);
  return block > 0 ? block : 16;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

int64_t WeightGeometry::valid_rows(int64_t rank) const {
  const int64_t remaining = rows - rank * shard_rows;
  return remaining <= 0 ? 0 : (remaining < shard_rows ? remaining : shard_rows);
}

static void check_columns(WireFormat format, int64_t cols) {
  const int64_t multiple = column_multiple(format);
  if (cols <= 0 || cols % multiple != 0) {
    throw std::invalid_argument(
        "cols=" + std::to_string(cols) + " is not a positive multiple of " +
        std::to_string(multiple) + " as the " + to_string(format) +
        " wire format requires (one scale block / one 16-byte access per row segment): pad "
        "in_features to a multiple of " + std::to_string(multiple));
  }
}

WeightGeometry weight_geometry(WireFormat format, int64_t rows, int64_t cols, int64_t group_size) {
  if (rows <= 0) {
    throw std::invalid_argument("rows=" + std::to_string(rows) +
                                " must be positive (the weight's out_features)");
  }
  if (group_size <= 0) {
    throw std::invalid_argument("group_size=" + std::to_string(group_size) +
                                " must be positive (the gtp_remat group size G)");
  }
  check_columns(format, cols);
  // Every byte count derived from the shape (FP32 shard and grad buffer, wire chunks, the gathered
  // and GEMM-ready copies with their section round-ups) fits in int64 below this many elements.
  constexpr int64_t kMaxElements = int64_t{1} << 58;
  int64_t multiple = 0, elements = 0;
  if (rows > kMaxElements || __builtin_mul_overflow(row_alignment(format), group_size, &multiple) ||
      multiple > kMaxElements || __builtin_mul_overflow(round_up(rows, multiple), cols, &elements) ||
      elements > kMaxElements) {
    throw std::invalid_argument("rows=" + std::to_string(rows) + " x cols=" + std::to_string(cols) + " (G=" +
                                std::to_string(group_size) + ", rows padded to a multiple of " +
                                std::to_string(row_alignment(format)) + " x G) exceeds 2^58 elements, the most "
                                "whose byte sizes (grad buffer, wire chunks) fit in 64 bits: check the shape");
  }
  WeightGeometry g;
  g.rows = rows;
  g.cols = cols;
  g.group_size = group_size;
  g.padded_rows = round_up(rows, row_alignment(format) * group_size);
  g.shard_rows = g.padded_rows / group_size;
  return g;
}

ChunkLayout chunk_layout(const WireSpec& spec, int64_t shard_rows, int64_t cols) {
  const WireFormat format = spec.format;
  const int64_t align = row_alignment(format);
  if (shard_rows <= 0 || shard_rows % align != 0) {
    throw std::invalid_argument("shard_rows=" + std::to_string(shard_rows) +
                                " is not a positive multiple of " + std::to_string(align) +
                                " as " + to_string(format) +
                                " shards require: derive it with weight_geometry()");
  }
  check_columns(format, cols);
  ChunkLayout l;
  l.shard_rows = shard_rows;
  l.cols = cols;
  const int64_t elements = shard_rows * cols;
  switch (format) {
    case WireFormat::kBF16: l.data_bytes = elements * 2; break;
    case WireFormat::kFP8:
    case WireFormat::kMXFP8: l.data_bytes = elements; break;
    case WireFormat::kNVFP4: l.data_bytes = elements / 2; break;
  }
  if (format == WireFormat::kMXFP8 ||
      (format == WireFormat::kNVFP4 && spec.nvfp4_blocks == Nvfp4Blocks::k1D)) {
    l.scales_per_row = cols / block_width(format);
    l.scales_bytes = shard_rows * l.scales_per_row;
  } else if (format == WireFormat::kNVFP4) {
    l.scales_bytes = (shard_rows / 16) * (cols / 16);
  }
  if (format == WireFormat::kFP8 || format == WireFormat::kNVFP4) {
    l.scalars_bytes = kChunkScalarCount * static_cast<int64_t>(sizeof(float));
  }
  l.data_offset = 0;
  l.scales_offset = round_up(l.data_bytes, kSectionAlignment);
  l.scalars_offset = round_up(l.scales_offset + l.scales_bytes, kSectionAlignment);
  l.chunk_bytes = round_up(l.scalars_offset + l.scalars_bytes, kSectionAlignment);
  return l;
}

// Bytes of a scale matrix in `layout`: blocked matrices are whole 128 x 4 tiles.
static int64_t scale_matrix_bytes(ScaleLayout layout, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return 0;
  return layout == ScaleLayout::kBlocked128x4 ? round_up(rows, 128) * round_up(cols, 4) : rows * cols;
}

GemmLayoutSizes gemm_layout_sizes(const WireSpec& spec, const WeightGeometry& geometry, ScaleLayout scale_layout) {
  if (scale_layout != ScaleLayout::kRowMajor && scale_layout != ScaleLayout::kBlocked128x4) {
    throw std::invalid_argument("unknown scale layout value " + std::to_string(static_cast<int>(scale_layout)) +
                                ": use ScaleLayout::kRowMajor or kBlocked128x4");
  }
  GemmLayoutSizes s;
  const int64_t cols = geometry.cols;
  const bool blocked = scale_layout == ScaleLayout::kBlocked128x4;
  s.scale_layout = scale_layout;
  s.gemm_rows = round_up(geometry.rows, row_alignment(spec.format));
  switch (spec.format) {
    case WireFormat::kBF16:
      break;
    case WireFormat::kFP8:
      s.data_bytes = s.gemm_rows * cols;
      s.transpose_supported = true;
      s.transposed_data_bytes = s.data_bytes;
      s.decode_scale_count = geometry.group_size;
      break;
    case WireFormat::kMXFP8:
      s.data_bytes = s.gemm_rows * cols;
      s.scale_rows = s.gemm_rows;
      s.scale_cols = cols / 32;
      break;
    case WireFormat::kNVFP4:
      s.data_bytes = s.gemm_rows * cols / 2;
      s.decode_scale_count = geometry.group_size;
      s.scale_cols = cols / 16;
      if (spec.nvfp4_blocks == Nvfp4Blocks::k1D) {
        s.scale_rows = s.gemm_rows;
      } else {
        s.scale_rows = blocked ? s.gemm_rows : s.gemm_rows / 16;
        s.transpose_supported = true;
        s.transposed_data_bytes = s.data_bytes;
        s.transposed_scale_rows = blocked ? cols : cols / 16;
        s.transposed_scale_cols = s.gemm_rows / 16;
      }
      break;
  }
  s.scales_bytes = scale_matrix_bytes(scale_layout, s.scale_rows, s.scale_cols);
  s.transposed_scales_bytes =
      scale_matrix_bytes(scale_layout, s.transposed_scale_rows, s.transposed_scale_cols);
  return s;
}

}  // namespace gtp::kernels

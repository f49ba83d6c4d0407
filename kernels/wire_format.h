// Wire formats: what one rank's packed shard (a "wire chunk") looks like, byte for byte.
// docs/formats.md is the prose version of this header and of codecs.h; keep them in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gtp::kernels {

enum class WireFormat { kBF16, kFP8, kMXFP8, kNVFP4 };

// MXFP8 E8M0 block-scale rounding: RCEIL is TransformerEngine's rule, FLOOR is OCP MX v1.0's.
enum class ScaleRounding { kRceil, kFloor };

// NVFP4 scale blocks: 1x16 along a row, or 16x16 tiles (whose transpose is exact).
enum class Nvfp4Blocks { k1D, k2D };

// How the GEMM layout stores block scales (docs/formats.md, "Blocked scales"). Row-major: the scale
// matrix as it is. Blocked 128x4: the tiled layout cuBLASLt's and cuDNN's block-scaled GEMMs read
// (Blackwell), zero-padded to whole 128 x 4 tiles, with one scale row per data row: NVFP4 16x16
// tiles then repeat their scale on each of their 16 rows (and columns, for the transpose).
enum class ScaleLayout { kRowMajor, kBlocked128x4 };

// The element type of the shard that pack reads and of the weight that unpack writes.
enum class SourceDtype { kBF16, kFP32 };

struct WireSpec {
  WireFormat format = WireFormat::kBF16;
  ScaleRounding mx_rounding = ScaleRounding::kRceil;
  Nvfp4Blocks nvfp4_blocks = Nvfp4Blocks::k1D;

  // Same bytes for the same shard: every field, so a new field cannot be forgotten by a caller.
  bool operator==(const WireSpec& o) const {
    return format == o.format && mx_rounding == o.mx_rounding && nvfp4_blocks == o.nvfp4_blocks;
  }
  bool operator!=(const WireSpec& o) const { return !(*this == o); }
};
std::string to_string(const WireSpec& spec);  // "mxfp8 (floor)", "nvfp4 (2d)", "fp8"

// Every section of a chunk starts on this boundary and the chunk size is a multiple of it.
inline constexpr int64_t kSectionAlignment = 256;
// Pointers handed to pack/unpack must be aligned so the kernels can use 16-byte accesses.
inline constexpr int64_t kPointerAlignment = 16;
// Number of FP32 scalars at the start of the scalars section (FP8 and NVFP4 only).
inline constexpr int kChunkScalarCount = 4;
// Index of each per-chunk FP32 scalar.
enum ChunkScalar : int {
  kDecodeScale = 0,  // FP8: 1/scale. NVFP4: the global decode scale S_dec = 1/S_enc.
  kAmax = 1,         // the tensor (FP8) or global (NVFP4) amax the chunk was encoded with
};

std::string to_string(WireFormat format);
std::string to_string(ScaleRounding rounding);
std::string to_string(Nvfp4Blocks blocks);
std::string to_string(SourceDtype dtype);
std::string to_string(ScaleLayout layout);
// Parses "bf16" | "fp8" | "mxfp8" | "nvfp4"; throws std::invalid_argument naming the choices.
WireFormat parse_wire_format(const std::string& name);

// Row alignment of a shard: 16 for BF16 / FP8 / NVFP4, 32 for MXFP8.
int64_t row_alignment(WireFormat format);
// Elements that share one scale along a row: 32 (MXFP8), 16 (NVFP4), 0 (BF16, FP8: no blocks).
int64_t block_width(WireFormat format);
// The columns of a row must be a multiple of this (block width, or 16 for BF16 / FP8).
int64_t column_multiple(WireFormat format);
int64_t round_up(int64_t value, int64_t multiple);

// How the rows of one TP-local weight are split over a gtp_remat group of size G.
struct WeightGeometry {
  int64_t rows = 0;         // logical out_features of the TP-local weight
  int64_t cols = 0;         // in_features
  int64_t group_size = 1;   // G
  int64_t padded_rows = 0;  // rows rounded up to row_alignment x G
  int64_t shard_rows = 0;   // padded_rows / G: every rank holds this many rows
  // Rows of rank `rank`'s shard that hold weight rows; the rest are tail padding.
  int64_t valid_rows(int64_t rank) const;
};
// Throws std::invalid_argument for non-positive sizes, columns that are not a multiple of
// column_multiple(format), or a padded shape over 2^58 elements (its byte sizes would overflow).
WeightGeometry weight_geometry(WireFormat format, int64_t rows, int64_t cols, int64_t group_size);

// Byte layout of one wire chunk holding shard_rows x cols elements.
struct ChunkLayout {
  int64_t shard_rows = 0;
  int64_t cols = 0;
  int64_t data_offset = 0;
  int64_t data_bytes = 0;
  int64_t scales_offset = 0;
  int64_t scales_bytes = 0;   // 0 when the format has no block scales
  int64_t scales_per_row = 0; // MXFP8 and NVFP4 1D: scale bytes per row (row-major rows x this)
  int64_t scalars_offset = 0;
  int64_t scalars_bytes = 0;  // 0 when the format carries no per-chunk scalars
  int64_t chunk_bytes = 0;    // multiple of kSectionAlignment
};
// Throws std::invalid_argument when shard_rows is not a positive multiple of row_alignment or cols
// is not a positive multiple of column_multiple.
ChunkLayout chunk_layout(const WireSpec& spec, int64_t shard_rows, int64_t cols);

// Sizes of the GEMM-ready unpack outputs for the whole weight. The rows keep the alignment padding
// (gemm_rows = rows rounded up to row_alignment) and drop the rest, so M/N may be taken as `rows`
// with these leading dimensions.
struct GemmLayoutSizes {
  int64_t gemm_rows = 0;
  int64_t data_bytes = 0;        // [gemm_rows, cols] codes (NVFP4: two per byte)
  ScaleLayout scale_layout = ScaleLayout::kRowMajor;
  // The scale matrix of `data`, before any blocking: MXFP8 [gemm_rows, cols/32]; NVFP4 1D
  // [gemm_rows, cols/16]; NVFP4 2D [gemm_rows/16, cols/16] row-major, [gemm_rows, cols/16] blocked
  // (a row per data row); 0 x 0 for FP8.
  int64_t scale_rows = 0, scale_cols = 0;
  int64_t scales_bytes = 0;      // scale_rows x scale_cols, or whole 128 x 4 tiles when blocked
  int64_t transposed_data_bytes = 0;    // FP8 [cols, gemm_rows]; NVFP4 2D [cols, gemm_rows/2]
  // NVFP4 2D, the scales of the transpose: [cols/16, gemm_rows/16] row-major, [cols, gemm_rows/16]
  // blocked; 0 x 0 otherwise.
  int64_t transposed_scale_rows = 0, transposed_scale_cols = 0;
  int64_t transposed_scales_bytes = 0;
  bool transpose_supported = false;     // exact transposes only: FP8 and NVFP4 2D
  int64_t decode_scale_count = 0;       // FP8 and NVFP4: one FP32 per chunk (G)
};
// Throws std::invalid_argument for an unknown scale layout.
GemmLayoutSizes gemm_layout_sizes(const WireSpec& spec, const WeightGeometry& geometry,
                                  ScaleLayout scale_layout = ScaleLayout::kRowMajor);

}  // namespace gtp::kernels

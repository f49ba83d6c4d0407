// The CPU reference (the spec) end to end: layouts, round trips against float64 with the
// documented error bounds, every edge case, the GEMM layout, and refusal of bad input.
#include "kernels/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/codecs.h"
#include "kernels/internal/test_data.h"
#include "kernels/scale_layout.h"

namespace gtp::kernels {
namespace {

using testing::AlignedBytes;
using testing::kAllSpecs;
using testing::name;
using testing::EdgeCases;
using testing::random_weight;
using testing::shard_bytes;

// Packs every rank's shard of `w` and lays the chunks out as the all-gather would.
struct Gathered {
  WeightGeometry geometry;
  ChunkLayout layout;
  AlignedBytes bytes{0};
};

Gathered pack_all(const WireSpec& spec, const std::vector<float>& w, int64_t rows, int64_t cols,
                  int64_t G, SourceDtype dtype, const float* shared_amax) {
  Gathered g;
  g.geometry = weight_geometry(spec.format, rows, cols, G);
  g.layout = chunk_layout(spec, g.geometry.shard_rows, cols);
  g.bytes = AlignedBytes(g.layout.chunk_bytes * G);
  for (int64_t rank = 0; rank < G; ++rank) {
    const int64_t valid = g.geometry.valid_rows(rank);
    AlignedBytes shard = shard_bytes(w, cols, rank * g.geometry.shard_rows, valid, dtype);
    PackArgs a;
    a.shard = shard.data();
    a.src_dtype = dtype;
    a.shard_rows = g.geometry.shard_rows;
    a.valid_rows = valid;
    a.cols = cols;
    a.amax = shared_amax;
    a.chunk = g.bytes.data() + rank * g.layout.chunk_bytes;
    a.chunk_capacity = g.layout.chunk_bytes;
    pack_reference(spec, a);
  }
  return g;
}

GatheredChunks view(const Gathered& g) {
  return GatheredChunks{g.bytes.data(), static_cast<int64_t>(g.bytes.size()), g.geometry};
}

std::vector<float> unpack_all(const WireSpec& spec, const Gathered& g) {
  const int64_t n = g.geometry.rows * g.geometry.cols;
  AlignedBytes out(n * 2);
  unpack_reference(spec, view(g), out.data(), n * 2);
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, out.data() + 2 * i, 2);
    values[i] = codec::bf16_to_float(h);
  }
  return values;
}

TEST(Layout, SectionsAreAlignedAndSized) {
  for (const WireSpec& spec : kAllSpecs) {
    const int64_t rows = row_alignment(spec.format) * 3;
    const ChunkLayout l = chunk_layout(spec, rows, 96);
    EXPECT_EQ(l.chunk_bytes % kSectionAlignment, 0) << name(spec);
    EXPECT_EQ(l.scales_offset % kSectionAlignment, 0) << name(spec);
    EXPECT_EQ(l.scalars_offset % kSectionAlignment, 0) << name(spec);
    EXPECT_GE(l.scales_offset, l.data_bytes);
    EXPECT_GE(l.scalars_offset, l.scales_offset + l.scales_bytes);
    EXPECT_GE(l.chunk_bytes, l.scalars_offset + l.scalars_bytes);
  }
  const ChunkLayout mx = chunk_layout({WireFormat::kMXFP8}, 64, 128);
  EXPECT_EQ(mx.data_bytes, 64 * 128);
  EXPECT_EQ(mx.scales_bytes, 64 * 4);
  EXPECT_EQ(mx.scalars_bytes, 0);
  EXPECT_EQ(mx.chunk_bytes, 8192 + 256);
  const ChunkLayout fp4 = chunk_layout({WireFormat::kNVFP4, {}, Nvfp4Blocks::k2D}, 32, 64);
  EXPECT_EQ(fp4.data_bytes, 32 * 32);
  EXPECT_EQ(fp4.scales_bytes, 2 * 4);
  EXPECT_EQ(fp4.scalars_offset, 1024 + 256);
  EXPECT_EQ(fp4.chunk_bytes, 1024 + 512);
}

TEST(Geometry, PadsRowsToAlignmentTimesGroup) {
  const WeightGeometry g = weight_geometry(WireFormat::kBF16, 1000, 64, 8);
  EXPECT_EQ(g.padded_rows, 1024);
  EXPECT_EQ(g.shard_rows, 128);
  EXPECT_EQ(g.valid_rows(0), 128);
  EXPECT_EQ(g.valid_rows(7), 1000 - 7 * 128);
  const WeightGeometry mx = weight_geometry(WireFormat::kMXFP8, 100, 64, 3);
  EXPECT_EQ(mx.padded_rows, 192);
  EXPECT_EQ(mx.valid_rows(1), 36);
  EXPECT_EQ(mx.valid_rows(2), 0);  // the padding can span whole shards
}

// Round trip with per-format bounds, over several shapes, group sizes, both source dtypes, and
// both scale modes (own amax per chunk, or one shared amax).
struct RoundTripCase {
  int64_t rows, cols, G;
  SourceDtype dtype;
  bool shared_amax;
};

const RoundTripCase kCases[] = {
    {256, 128, 1, SourceDtype::kBF16, false}, {1000, 64, 8, SourceDtype::kBF16, true},
    {333, 96, 3, SourceDtype::kFP32, false},  {130, 256, 2, SourceDtype::kFP32, true},
    {31, 32, 4, SourceDtype::kBF16, false},
};

// The largest |x^ - x| the format allows for element x (the source value after BF16 rounding
// when the source is BF16), given the decoded output went through one BF16 rounding.
double bound(const WireSpec& spec, const Gathered& g, int64_t r, int64_t c, double x) {
  const uint8_t* chunk = g.bytes.data() + (r / g.layout.shard_rows) * g.layout.chunk_bytes;
  const int64_t local = r % g.layout.shard_rows;
  // One BF16 rounding of the output: half an ulp, or half the smallest subnormal (2^-133).
  const double out_rounding = std::ldexp(std::fabs(x), -8) + std::ldexp(1.0, -134);
  float decode;
  std::memcpy(&decode, chunk + g.layout.scalars_offset, 4);
  switch (spec.format) {
    case WireFormat::kBF16:
      return out_rounding;
    case WireFormat::kFP8:  // 3 mantissa bits; below E4M3's normals half a unit of 2^-9
      return std::ldexp(std::fabs(x), -4) + std::ldexp(decode, -10) + out_rounding;
    case WireFormat::kMXFP8: {
      const double s = codec::e8m0_to_float(
          chunk[g.layout.scales_offset + local * g.layout.scales_per_row + c / 32]);
      // FLOOR lets the block maximum exceed 448 units; those elements saturate to 448 units.
      const double saturation = std::max(0.0, std::fabs(x) - 448.0 * s);
      return std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10) + saturation + out_rounding;
    }
    case WireFormat::kNVFP4: {
      const uint8_t* scales = chunk + g.layout.scales_offset;
      const uint8_t sb = spec.nvfp4_blocks == Nvfp4Blocks::k1D
                             ? scales[local * g.layout.scales_per_row + c / 16]
                             : scales[(local / 16) * (g.layout.cols / 16) + c / 16];
      // Largest E2M1 gap is 2 (4 -> 6): at most 1 unit of s_b * S_dec, plus saturation of the
      // block maximum by E4M3 rounding of s_b (at most 2^-4 of it).
      // A block whose scale lands in E4M3's subnormal range (amax far below the global amax)
      // gets a coarse s_b, and its largest elements saturate at 6 units.
      const double unit = static_cast<double>(codec::e4m3_to_float(sb)) * decode;
      const double saturation = std::max(0.0, std::fabs(x) - 6.0 * unit);
      return unit * 1.0001 + std::ldexp(std::fabs(x), -4) + saturation + out_rounding;
    }
  }
  return 0;
}

TEST(RoundTrip, EveryFormatStaysWithinItsBound) {
  EdgeCases edges;
  edges.huge = false;  // the bounds below are for in-range data; saturation is tested apart
  for (const WireSpec& spec : kAllSpecs) {
    for (const RoundTripCase& k : kCases) {
      const auto w = random_weight(k.rows, k.cols, 1000 + k.rows, edges);
      float amax = 0;
      for (float x : w) amax = std::max(amax, std::fabs(x));
      const Gathered g =
          pack_all(spec, w, k.rows, k.cols, k.G, k.dtype, k.shared_amax ? &amax : nullptr);
      const std::vector<float> out = unpack_all(spec, g);
      double err2 = 0, ref2 = 0;
      for (int64_t r = 0; r < k.rows; ++r) {
        for (int64_t c = 0; c < k.cols; ++c) {
          double x = w[r * k.cols + c];
          if (k.dtype == SourceDtype::kBF16) x = codec::bf16_to_float(codec::float_to_bf16(w[r * k.cols + c]));
          const double got = out[r * k.cols + c];
          ASSERT_LE(std::fabs(got - x), bound(spec, g, r, c, x))
              << name(spec) << " rows=" << k.rows << " G=" << k.G << " at (" << r << "," << c
              << ") x=" << x << " got=" << got;
          err2 += (got - x) * (got - x);
          ref2 += x * x;
        }
      }
      const double relative = std::sqrt(err2 / ref2);
      const double documented = spec.format == WireFormat::kBF16   ? 0.004
                                : spec.format == WireFormat::kNVFP4 ? 0.15
                                                                    : 0.04;
      EXPECT_LT(relative, documented) << name(spec);
      if (spec.format == WireFormat::kBF16 && k.dtype == SourceDtype::kBF16) {
        EXPECT_EQ(relative, 0.0) << "BF16 wire must be bit-exact for BF16 shards";
      }
    }
  }
}

TEST(RoundTrip, SharedAmaxGivesEveryChunkTheSameScale) {
  const auto w = random_weight(512, 64, 5);
  const float amax = 37.5f;
  for (WireFormat f : {WireFormat::kFP8, WireFormat::kNVFP4}) {
    const Gathered g = pack_all({f}, w, 512, 64, 4, SourceDtype::kBF16, &amax);
    for (int rank = 0; rank < 4; ++rank) {
      float scalars[2];
      std::memcpy(scalars, g.bytes.data() + rank * g.layout.chunk_bytes + g.layout.scalars_offset,
                  8);
      EXPECT_EQ(scalars[kAmax], amax);
      EXPECT_EQ(scalars[kDecodeScale], f == WireFormat::kFP8
                                           ? 1.0f / codec::fp8_encode_scale(amax)
                                           : 1.0f / codec::nvfp4_encode_scale(amax));
    }
  }
}

TEST(EdgeCases, ZeroBlocksNonFiniteAndSaturation) {
  const int64_t rows = 32, cols = 64;
  std::vector<float> w(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) w[i] = 0.01f * static_cast<float>(i % 97 - 48);
  for (int64_t c = 0; c < 32; ++c) w[0 * cols + c] = 0.0f;  // row 0, first MX block: all zero
  w[1 * cols + 40] = std::nanf("");                          // row 1, second MX block: NaN
  w[2 * cols + 3] = INFINITY;                                // row 2, first block: +Inf

  // FP8 with a shared amax smaller than the data: saturation to +-448, NaN kept, Inf saturates.
  const float small_amax = 0.1f;
  Gathered fp8 = pack_all({WireFormat::kFP8}, w, rows, cols, 1, SourceDtype::kFP32, &small_amax);
  const uint8_t* d = fp8.bytes.data();
  EXPECT_EQ(d[1 * cols + 40], codec::kE4M3NaN);
  EXPECT_EQ(d[2 * cols + 3], 0x7e);
  EXPECT_EQ(d[5 * cols + 63], 0x7e) << "0.47 encoded at scale 4480 must saturate";
  EXPECT_EQ(d[5 * cols + 0], 0xfe);

  Gathered mx = pack_all({WireFormat::kMXFP8}, w, rows, cols, 1, SourceDtype::kFP32, nullptr);
  const uint8_t* scales = mx.bytes.data() + mx.layout.scales_offset;
  EXPECT_EQ(scales[0], 0) << "all-zero block has scale 2^-127 (code 0)";
  EXPECT_EQ(scales[1 * 2 + 1], codec::kE8M0NaN);
  EXPECT_EQ(scales[2 * 2 + 0], codec::kE8M0NaN) << "an infinite element makes the block NaN";
  for (int64_t c = 0; c < 32; ++c) {
    EXPECT_EQ(mx.bytes.data()[c], 0);
    EXPECT_EQ(mx.bytes.data()[1 * cols + 32 + c], 0) << "NaN block codes are zero";
  }
  const std::vector<float> mx_out = unpack_all({WireFormat::kMXFP8}, mx);
  EXPECT_TRUE(std::isnan(mx_out[1 * cols + 33]));
  EXPECT_FALSE(std::isnan(mx_out[1 * cols + 31])) << "other blocks of the row are unaffected";
  EXPECT_EQ(mx_out[0], 0.0f);

  for (Nvfp4Blocks b : {Nvfp4Blocks::k1D, Nvfp4Blocks::k2D}) {
    const WireSpec spec{WireFormat::kNVFP4, ScaleRounding::kRceil, b};
    Gathered fp4 = pack_all(spec, w, rows, cols, 1, SourceDtype::kFP32, nullptr);
    float scalars[2];
    std::memcpy(scalars, fp4.bytes.data() + fp4.layout.scalars_offset, 8);
    EXPECT_EQ(scalars[kAmax], 0.48f) << "the global amax skips NaN and Inf";
    const std::vector<float> out = unpack_all(spec, fp4);
    EXPECT_TRUE(std::isnan(out[1 * cols + 40]));
    if (b == Nvfp4Blocks::k1D) {
      EXPECT_EQ(out[0], 0.0f);
      EXPECT_FALSE(std::isnan(out[0 * cols + 40]));
    } else {  // the 16x16 tile of rows 0-15, cols 0-15 holds the +Inf at (2, 3)
      EXPECT_TRUE(std::isnan(out[0]));
      EXPECT_FALSE(std::isnan(out[16 * cols + 0]));
    }
  }
}

TEST(EdgeCases, SubnormalAndTinyTensors) {
  const int64_t rows = 32, cols = 32;
  std::vector<float> w(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) w[i] = static_cast<float>(i % 13 - 6) * 1e-41f;
  for (const WireSpec& spec : kAllSpecs) {
    const Gathered g = pack_all(spec, w, rows, cols, 1, SourceDtype::kFP32, nullptr);
    const std::vector<float> out = unpack_all(spec, g);
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_FALSE(std::isnan(out[i])) << name(spec) << " at " << i;
      ASSERT_LE(std::fabs(out[i]), 1e-39f) << name(spec) << " at " << i;
    }
  }
  // FP8's scale clamps to FLT_MAX rather than overflowing to Inf.
  const Gathered fp8 = pack_all({WireFormat::kFP8}, w, rows, cols, 1, SourceDtype::kFP32, nullptr);
  float decode;
  std::memcpy(&decode, fp8.bytes.data() + fp8.layout.scalars_offset, 4);
  EXPECT_EQ(decode, 1.0f / codec::kFloatMax);
}

TEST(EdgeCases, PaddingRowsAreZeroAndExcludedFromAmax) {
  const int64_t rows = 20, cols = 32;
  const auto w = random_weight(rows, cols, 3, EdgeCases{false, false, false, false});
  for (const WireSpec& spec : kAllSpecs) {
    const Gathered g = pack_all(spec, w, rows, cols, 2, SourceDtype::kBF16, nullptr);
    const std::vector<float> out = unpack_all(spec, g);
    EXPECT_EQ(out.size(), static_cast<size_t>(rows * cols));
    // Rank 1 holds no weight rows at all for MXFP8 (rows 32..63): its chunk data is all zero.
    if (spec.format == WireFormat::kMXFP8) {
      const uint8_t* chunk1 = g.bytes.data() + g.layout.chunk_bytes;
      for (int64_t i = 0; i < g.layout.data_bytes; ++i) ASSERT_EQ(chunk1[i], 0);
    }
  }
}

TEST(Gemm, LayoutMatchesChunksAndTransposesExactly) {
  const int64_t rows = 100, cols = 64, G = 3;
  const auto w = random_weight(rows, cols, 9);
  for (const WireSpec& spec : kAllSpecs) {
    if (spec.format == WireFormat::kBF16) continue;
    const Gathered g = pack_all(spec, w, rows, cols, G, SourceDtype::kBF16, nullptr);
    const GemmLayoutSizes sizes = gemm_layout_sizes(spec, g.geometry);
    AlignedBytes data(sizes.data_bytes), scales(std::max<int64_t>(sizes.scales_bytes, 16));
    AlignedBytes data_t(std::max<int64_t>(sizes.transposed_data_bytes, 16));
    AlignedBytes scales_t(std::max<int64_t>(sizes.transposed_scales_bytes, 16));
    std::vector<float> decode(G, -1.0f);
    GemmOutputs out{data.data(), sizes.data_bytes, scales.data(), sizes.scales_bytes,
                    sizes.transpose_supported ? data_t.data() : nullptr,
                    sizes.transposed_data_bytes, scales_t.data(), sizes.transposed_scales_bytes,
                    decode.data(), G};
    unpack_gemm_reference(spec, view(g), out);
    // Decoding the GEMM layout with the per-chunk decode scales reproduces unpack's values.
    const std::vector<float> expected = unpack_all(spec, g);
    const bool fp4 = spec.format == WireFormat::kNVFP4;
    for (int64_t r = 0; r < rows; ++r) {
      const float chunk_scale = decode[r / g.geometry.shard_rows];
      for (int64_t c = 0; c < cols; ++c) {
        float value;
        if (spec.format == WireFormat::kFP8) {
          value = codec::e4m3_to_float(data.data()[r * cols + c]) * chunk_scale;
          EXPECT_EQ(data_t.data()[c * sizes.gemm_rows + r], data.data()[r * cols + c]);
        } else if (spec.format == WireFormat::kMXFP8) {
          value = codec::e4m3_to_float(data.data()[r * cols + c]) *
                  codec::e8m0_to_float(scales.data()[r * (cols / 32) + c / 32]);
        } else {
          const uint8_t byte = data.data()[r * cols / 2 + c / 2];
          const uint8_t code = (c & 1) ? byte >> 4 : byte & 0xf;
          const bool two_d = spec.nvfp4_blocks == Nvfp4Blocks::k2D;
          const uint8_t sb = two_d ? scales.data()[(r / 16) * (cols / 16) + c / 16]
                                   : scales.data()[r * (cols / 16) + c / 16];
          value = codec::nvfp4_decode(code, sb, chunk_scale);
          if (two_d) {  // the transposed copy decodes to the transposed weight
            const uint8_t tbyte = data_t.data()[c * sizes.gemm_rows / 2 + r / 2];
            const uint8_t tcode = (r & 1) ? tbyte >> 4 : tbyte & 0xf;
            const uint8_t tsb = scales_t.data()[(c / 16) * (sizes.gemm_rows / 16) + r / 16];
            ASSERT_EQ(codec::float_to_bf16(codec::nvfp4_decode(tcode, tsb, chunk_scale)),
                      codec::float_to_bf16(value));
          }
        }
        ASSERT_EQ(codec::float_to_bf16(value), codec::float_to_bf16(expected[r * cols + c]))
            << name(spec) << " (" << r << "," << c << ")";
      }
    }
    (void)fp4;
  }
}

// The blocked layout's byte order, spelled the way PyTorch code builds it for cuBLASLt
// (view(nrb, 128, ncb, 4).permute(0, 2, 1, 3).reshape(-1, 4, 32, 4).transpose(1, 2).flatten()): walk
// the tiles in order and, inside one, rows r0 = 0..31 outermost, then the quarter r1, then the column.
TEST(BlockedScales, OffsetsFollowCublasTileOrder) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{128, 4}, {256, 8}, {300, 7}, {16, 2}, {1024, 130}}) {
    const int64_t padded_rows = round_up(rows, 128), padded_cols = round_up(cols, 4);
    std::vector<int64_t> position(padded_rows * padded_cols, -1);  // (r, c) -> byte in the walk
    int64_t next = 0;
    for (int64_t rb = 0; rb < padded_rows / 128; ++rb)
      for (int64_t cb = 0; cb < padded_cols / 4; ++cb)
        for (int64_t r0 = 0; r0 < 32; ++r0)
          for (int64_t r1 = 0; r1 < 4; ++r1)
            for (int64_t j = 0; j < 4; ++j) position[(rb * 128 + r1 * 32 + r0) * padded_cols + cb * 4 + j] = next++;
    ASSERT_EQ(next, padded_rows * padded_cols);
    for (int64_t r = 0; r < padded_rows; ++r)
      for (int64_t c = 0; c < padded_cols; ++c)
        ASSERT_EQ(scale_offset(true, r, c, cols), position[r * padded_cols + c]) << rows << "x" << cols << " (" << r << ", " << c << ")";
    EXPECT_EQ(scale_offset(false, 5, 3, cols), 5 * cols + 3);
  }
}

// The GEMM layout with blocked scales: the same data, data_t and decode scales as row-major, every
// scale where the tile order puts it (2D tiles repeated on each of their rows, and on each column
// for the transpose), and zeros in the padding of the last tiles.
TEST(BlockedScales, GemmLayoutHoldsTheRowMajorScalesInTileOrder) {
  const int64_t rows = 150, cols = 96, G = 3;  // ragged 128-row tiles; 3 or 6 scale columns
  const auto w = random_weight(rows, cols, 12);
  for (const WireSpec& spec : kAllSpecs) {
    if (spec.format != WireFormat::kMXFP8 && spec.format != WireFormat::kNVFP4) continue;
    const Gathered g = pack_all(spec, w, rows, cols, G, SourceDtype::kBF16, nullptr);
    struct Output {
      GemmLayoutSizes sizes;
      AlignedBytes data, scales, data_t, scales_t;
      std::vector<float> decode;
    };
    auto unpack = [&](ScaleLayout layout) {
      Output o{gemm_layout_sizes(spec, g.geometry, layout), AlignedBytes(16), AlignedBytes(16), AlignedBytes(16),
               AlignedBytes(16), std::vector<float>(G, -1.0f)};
      o.data = AlignedBytes(o.sizes.data_bytes);
      o.scales = AlignedBytes(o.sizes.scales_bytes, 0xee);  // poisoned: padding must be written
      o.data_t = AlignedBytes(std::max<int64_t>(o.sizes.transposed_data_bytes, 16));
      o.scales_t = AlignedBytes(std::max<int64_t>(o.sizes.transposed_scales_bytes, 16), 0xee);
      GemmOutputs out{o.data.data(), o.sizes.data_bytes, o.scales.data(), o.sizes.scales_bytes,
                      o.sizes.transpose_supported ? o.data_t.data() : nullptr, o.sizes.transposed_data_bytes,
                      o.scales_t.data(), o.sizes.transposed_scales_bytes, o.decode.data(), G, layout};
      unpack_gemm_reference(spec, view(g), out);
      return o;
    };
    const Output row_major = unpack(ScaleLayout::kRowMajor), blocked = unpack(ScaleLayout::kBlocked128x4);
    SCOPED_TRACE(name(spec));
    const GemmLayoutSizes& rs = row_major.sizes;
    const GemmLayoutSizes& bs = blocked.sizes;
    const bool two_d = spec.format == WireFormat::kNVFP4 && spec.nvfp4_blocks == Nvfp4Blocks::k2D;
    ASSERT_EQ(bs.scale_rows, rs.gemm_rows);
    ASSERT_EQ(bs.scales_bytes, round_up(bs.scale_rows, 128) * round_up(bs.scale_cols, 4));
    EXPECT_EQ(0, std::memcmp(row_major.data.data(), blocked.data.data(), rs.data_bytes));
    EXPECT_EQ(row_major.decode, blocked.decode);
    std::vector<bool> written(bs.scales_bytes, false);
    for (int64_t r = 0; r < bs.scale_rows; ++r) {
      for (int64_t c = 0; c < bs.scale_cols; ++c) {
        const int64_t at = scale_offset(true, r, c, bs.scale_cols);
        const uint8_t want = row_major.scales.data()[(two_d ? r / 16 : r) * rs.scale_cols + c];
        ASSERT_EQ(blocked.scales.data()[at], want) << "scale (" << r << ", " << c << ")";
        written[at] = true;
      }
    }
    for (int64_t i = 0; i < bs.scales_bytes; ++i) {
      if (!written[i]) ASSERT_EQ(blocked.scales.data()[i], 0) << "padding byte " << i;
    }
    if (!two_d) continue;
    EXPECT_EQ(0, std::memcmp(row_major.data_t.data(), blocked.data_t.data(), rs.transposed_data_bytes));
    ASSERT_EQ(bs.transposed_scale_rows, cols);
    std::vector<bool> written_t(bs.transposed_scales_bytes, false);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t band = 0; band < bs.transposed_scale_cols; ++band) {
        const int64_t at = scale_offset(true, c, band, bs.transposed_scale_cols);
        ASSERT_EQ(blocked.scales_t.data()[at], row_major.scales_t.data()[(c / 16) * rs.transposed_scale_cols + band])
            << "transposed scale (" << c << ", " << band << ")";
        written_t[at] = true;
      }
    }
    for (int64_t i = 0; i < bs.transposed_scales_bytes; ++i) {
      if (!written_t[i]) ASSERT_EQ(blocked.scales_t.data()[i], 0) << "transposed padding byte " << i;
    }
  }
  EXPECT_THROW(gemm_layout_sizes(WireSpec{WireFormat::kMXFP8}, weight_geometry(WireFormat::kMXFP8, 64, 64, 1),
                                 static_cast<ScaleLayout>(7)),
               std::invalid_argument);
}

// Bad input: a clear message naming the value, and the output untouched.
TEST(BadInput, IsRefusedWithANamedValueAndNothingWritten) {
  const WireSpec mx{WireFormat::kMXFP8};
  AlignedBytes shard(64 * 64 * 2, 0x11), chunk(chunk_layout(mx, 64, 64).chunk_bytes, 0x5a);
  PackArgs good;
  good.shard = shard.data();
  good.shard_rows = 64;
  good.valid_rows = 64;
  good.cols = 64;
  good.chunk = chunk.data();
  good.chunk_capacity = static_cast<int64_t>(chunk.size());

  auto expect_refused = [&](const WireSpec& spec, PackArgs a, const std::string& needle) {
    try {
      pack_reference(spec, a);
      ADD_FAILURE() << "accepted, expected an error mentioning " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (size_t i = 0; i < chunk.size(); ++i) ASSERT_EQ(chunk.data()[i], 0x5a) << "wrote " << i;
  };
  PackArgs a = good;
  a.shard = nullptr;
  expect_refused(mx, a, "shard is null");
  a = good;
  a.chunk = chunk.data() + 4;
  expect_refused(mx, a, "not 16-byte aligned");
  a = good;
  a.cols = 48;
  expect_refused(mx, a, "cols=48");
  a = good;
  a.shard_rows = 48;
  expect_refused(mx, a, "shard_rows=48");
  a = good;
  a.valid_rows = 65;
  expect_refused(mx, a, "valid_rows=65");
  a = good;
  a.chunk_capacity = 100;
  expect_refused(mx, a, "chunk_capacity=100");
  expect_refused(WireSpec{static_cast<WireFormat>(9)}, good, "unknown wire format value 9");
  expect_refused(WireSpec{WireFormat::kNVFP4, ScaleRounding::kRceil, static_cast<Nvfp4Blocks>(5)},
                 good, "NVFP4 block shape value 5");

  EXPECT_THROW(parse_wire_format("fp6"), std::invalid_argument);
  EXPECT_THROW(weight_geometry(WireFormat::kBF16, 0, 64, 2), std::invalid_argument);
  EXPECT_THROW(weight_geometry(WireFormat::kBF16, 64, 64, 0), std::invalid_argument);

  // Unpack: wrong capacity, BF16 GEMM layout, a transpose that cannot be exact.
  const auto w = random_weight(64, 64, 1);
  const Gathered g = pack_all(mx, w, 64, 64, 2, SourceDtype::kBF16, nullptr);
  AlignedBytes out(64 * 64 * 2, 0x77);
  EXPECT_THROW(unpack_reference(mx, view(g), out.data(), 64 * 64), std::invalid_argument);
  GatheredChunks short_view = view(g);
  short_view.capacity -= 1;
  EXPECT_THROW(unpack_reference(mx, short_view, out.data(), 64 * 64 * 2), std::invalid_argument);
  GatheredChunks wrong = view(g);
  wrong.geometry.shard_rows = 16;
  EXPECT_THROW(unpack_reference(mx, wrong, out.data(), 64 * 64 * 2), std::invalid_argument);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.data()[i], 0x77);

  const GemmLayoutSizes sizes = gemm_layout_sizes(mx, g.geometry);
  AlignedBytes data(sizes.data_bytes), scales(sizes.scales_bytes), t(sizes.data_bytes);
  GemmOutputs gemm{data.data(), sizes.data_bytes, scales.data(), sizes.scales_bytes,
                   t.data(), sizes.data_bytes, nullptr, 0, nullptr, 0};
  try {
    unpack_gemm_reference(mx, view(g), gemm);
    ADD_FAILURE() << "MXFP8 transpose accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be transposed exactly"), std::string::npos);
  }
  EXPECT_THROW(unpack_gemm_reference({WireFormat::kBF16}, view(g), gemm), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::kernels

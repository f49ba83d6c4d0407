// Test inputs shared by the CPU and GPU kernel tests: fresh random weights with edge cases planted.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/codecs.h"
#include "kernels/wire_format.h"

namespace gtp::kernels::testing {

// Every wire spec the tests sweep: each format, both MXFP8 roundings, both NVFP4 block shapes.
inline const WireSpec kAllSpecs[] = {
    {WireFormat::kBF16},
    {WireFormat::kFP8},
    {WireFormat::kMXFP8, ScaleRounding::kRceil},
    {WireFormat::kMXFP8, ScaleRounding::kFloor},
    {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k1D},
    {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D},
};

inline std::string name(const WireSpec& s) {
  return to_string(s.format) + "/" + to_string(s.mx_rounding) + "/" + to_string(s.nvfp4_blocks);
}

// A host buffer aligned for the kernels' 16-byte accesses.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t bytes, uint8_t fill = 0xA5) : storage_(bytes + 64, fill) {}
  uint8_t* data() {
    auto p = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + ((64 - p % 64) % 64);
  }
  const uint8_t* data() const { return const_cast<AlignedBytes*>(this)->data(); }
  size_t size() const { return storage_.size() - 64; }

 private:
  std::vector<uint8_t> storage_;
};

// Which edge cases to plant in a random weight.
struct EdgeCases {
  bool zero_blocks = true;   // a whole 32 x 32 region of zeros
  bool tiny = true;          // values around the FP32 and BF16 subnormal range
  bool huge = true;          // values near the BF16 maximum (saturate after scaling)
  bool non_finite = false;   // NaN, +Inf, -Inf at a few places
};

// rows x cols values of roughly N(0, 1) times a per-row-band magnitude spread over 2^-8..2^8, so
// that shards and blocks have different scales.
inline std::vector<float> random_weight(int64_t rows, int64_t cols, uint64_t seed,
                                        const EdgeCases& edges = {}) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> band_exponent(-8, 8);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float band = std::ldexp(1.0f, band_exponent(rng));
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = normal(rng) * band;
  }
  std::uniform_int_distribution<int64_t> pick(0, rows * cols - 1);
  if (edges.zero_blocks && rows >= 32 && cols >= 32) {
    const int64_t r0 = (rows / 2) / 32 * 32;
    for (int64_t r = r0; r < r0 + 32 && r < rows; ++r)
      for (int64_t c = 0; c < 32; ++c) w[r * cols + c] = 0.0f;
  }
  if (edges.tiny) {
    const float tiny[] = {1e-38f, -3e-39f, 1.4e-45f, 9.2e-41f, -1e-30f, 6e-8f};
    for (float t : tiny) w[pick(rng)] = t;
  }
  if (edges.huge) {
    const float huge[] = {3.3e38f, -1.7e38f, 6.5e4f, -448.0f * 1024.0f};
    for (float h : huge) w[pick(rng)] = h;
  }
  if (edges.non_finite) {
    w[pick(rng)] = std::nanf("");
    w[pick(rng)] = INFINITY;
    w[pick(rng)] = -INFINITY;
    w[pick(rng)] = -std::nanf("");
  }
  return w;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = codec::float_to_bf16(w[i]);
  return out;
}

// Copies rows [row0, row0 + n) of a rows x cols weight into an aligned buffer of dtype.
inline AlignedBytes shard_bytes(const std::vector<float>& w, int64_t cols, int64_t row0, int64_t n,
                                SourceDtype dtype) {
  const size_t element = dtype == SourceDtype::kBF16 ? 2 : 4;
  AlignedBytes out(static_cast<size_t>(std::max<int64_t>(n, 1) * cols) * element);
  for (int64_t i = 0; i < n * cols; ++i) {
    const float x = w[row0 * cols + i];
    if (dtype == SourceDtype::kBF16) {
      const uint16_t h = codec::float_to_bf16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &x, 4);
    }
  }
  return out;
}

}  // namespace gtp::kernels::testing

// The scalar codecs against independent float64 oracles, exhaustively over every BF16 input.
#include "kernels/codecs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace gtp::kernels::codec {
namespace {

// Nearest value of a sorted list of non-negative representables, ties to the even code (the list
// index), saturating at the top. Independent of the bit tricks under test.
int nearest_even(const std::vector<double>& values, double a) {
  if (a >= values.back()) return static_cast<int>(values.size()) - 1;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const double lo = values[i], hi = values[i + 1];
    if (a > hi) continue;
    const double mid = (lo + hi) / 2;
    if (a < mid) return static_cast<int>(i);
    if (a > mid) return static_cast<int>(i + 1);
    return (i % 2 == 0) ? static_cast<int>(i) : static_cast<int>(i + 1);
  }
  return static_cast<int>(values.size()) - 1;
}

std::vector<double> e4m3_magnitudes() {  // codes 0x00..0x7e in order
  std::vector<double> v;
  for (int code = 0; code < 0x7f; ++code) {
    const int e = code >> 3, m = code & 7;
    v.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
  }
  return v;
}

TEST(E4M3, EveryCodeDecodesAndReencodesToItself) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(static_cast<uint8_t>(code)))) << code;
      continue;
    }
    const float x = e4m3_to_float(static_cast<uint8_t>(code));
    EXPECT_EQ(float_to_e4m3(x), code) << "code " << code << " value " << x;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
}

TEST(E4M3, MatchesFloat64OracleOnEveryBf16Input) {
  const std::vector<double> mags = e4m3_magnitudes();
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    const uint8_t got = float_to_e4m3(x);
    if (std::isnan(x)) {
      EXPECT_EQ(got, kE4M3NaN);
      continue;
    }
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const uint8_t expected = sign | nearest_even(mags, std::fabs(static_cast<double>(x)));
    ASSERT_EQ(got, expected) << "x=" << x;
  }
}

TEST(E4M3, RoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // 1 + 1/16 is a tie between 1 and 1.125: even is 1
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even is 1.25
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of the smallest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: tie to 2
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3(-std::nanf("")), kE4M3NaN);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

TEST(E2M1, MatchesFloat64OracleOnEveryBf16Input) {
  const std::vector<double> mags = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;  // NaN never reaches the element codec
    const uint8_t expected =
        (std::signbit(x) ? 0x8 : 0) | nearest_even(mags, std::fabs(static_cast<double>(x)));
    ASSERT_EQ(float_to_e2m1(x), expected) << "x=" << x;
  }
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(float_to_e2m1(e2m1_to_float(static_cast<uint8_t>(code))), code);
  }
}

// The pack kernels' E2M1 rounding (e2m1_candidate, then saturation at 7) against the spec, over
// every pattern within 4096 ulps of each tie, binade edge and saturation point, every 251st
// non-negative finite pattern, and the specials. (An exhaustive run over all 2^31 patterns up to
// +Inf, 24 s optimized, also found no difference when it was written.)
TEST(E2M1, FmaCandidatesRoundLikeTheSpec) {
  auto check = [](uint32_t bits) {
    const float a = bits_float(bits);
    const uint32_t code = std::min(e2m1_candidate(a) - kE2M1CandidateBase, 7u);
    ASSERT_EQ(code, float_to_e2m1(a)) << "a=" << a << " bits=" << bits;
    // The negative value has the same magnitude code (the kernels take the sign from the input).
    ASSERT_EQ(code | 0x8u, float_to_e2m1(-a)) << "a=-" << a;
  };
  for (float point : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f}) {
    const uint32_t center = float_bits(point);
    for (uint32_t bits = center - 4096; bits <= center + 4096; ++bits) check(bits);
  }
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 251) check(bits);
  for (uint32_t bits : {0u, 1u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x7f800000u}) check(bits);
}

TEST(BF16, RoundsToNearestEvenLikeFloat64) {
  // Every float whose low 16 bits sit at or around the halfway point, across exponents.
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t high = 0; high < 0x10000; high += 7) {
    for (uint32_t low : lows) {
      const float x = bits_float((high << 16) | low);
      if (std::isnan(x)) {
        EXPECT_EQ(float_to_bf16(x), 0x7fff);
        continue;
      }
      const uint16_t down = static_cast<uint16_t>(high);
      const uint16_t up = static_cast<uint16_t>(high + 1);
      uint16_t expected = low < 0x8000 ? down : low > 0x8000 ? up : ((high & 1) ? up : down);
      ASSERT_EQ(float_to_bf16(x), expected) << std::hex << high << ":" << low;
    }
  }
}

TEST(E8M0, RceilIsTheSmallestPowerOfTwoAtOrAboveAmaxOver448) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-140, 127);
  for (int i = 0; i < 200000; ++i) {
    const float amax = static_cast<float>(std::exp2(exponent(rng)));
    const float v = amax * (1.0f / 448.0f);  // the FP32 product the spec rounds up
    const uint8_t e = e8m0_rceil(amax);
    ASSERT_NE(e, 0xff);
    if (v == 0.0f) {
      EXPECT_EQ(e, 0);
      continue;
    }
    const double scale = std::ldexp(1.0, e - 127);
    ASSERT_GE(scale, static_cast<double>(v)) << amax;
    if (e > 0 && v > std::ldexp(1.0, -127)) {
      ASSERT_LT(scale / 2, static_cast<double>(v)) << amax;
    }
  }
  EXPECT_EQ(e8m0_rceil(0.0f), 0);
  EXPECT_EQ(e8m0_rceil(448.0f), 127);          // exactly 1
  EXPECT_EQ(e8m0_rceil(449.0f), 128);          // just above: rounds up to 2
  EXPECT_EQ(e8m0_rceil(INFINITY), 0xfe);
}

TEST(E8M0, FloorFollowsOcp) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> exponent(-149, 127);
  for (int i = 0; i < 200000; ++i) {
    const float amax = static_cast<float>(std::exp2(exponent(rng)));
    if (amax == 0.0f) continue;
    const int expected = std::clamp(
        static_cast<int>(std::floor(std::log2(static_cast<double>(amax)))) - 8 + 127, 0, 254);
    // log2 of an exact power of two can land a hair under the integer in float64: recheck.
    const int exact = std::ilogb(amax) - 8 + 127;
    ASSERT_EQ(e8m0_floor(amax), std::clamp(exact, 0, 254)) << amax << " " << expected;
  }
  EXPECT_EQ(e8m0_floor(448.0f), 127);  // 448 = 1.75 * 2^8
  EXPECT_EQ(e8m0_floor(512.0f), 128);
  EXPECT_EQ(e8m0_floor(std::numeric_limits<float>::denorm_min()), 0);
}

TEST(E8M0, DecodeAndEncodeMultipliersAreReciprocal) {
  for (int e = 1; e < 254; ++e) {
    const double decoded = e8m0_to_float(static_cast<uint8_t>(e));
    EXPECT_EQ(decoded, std::ldexp(1.0, e - 127));
    EXPECT_EQ(decoded * mx_encode_multiplier(static_cast<uint8_t>(e), true), 1.0);
    EXPECT_EQ(decoded * mx_encode_multiplier(static_cast<uint8_t>(e), false), 1.0);
  }
  EXPECT_EQ(mx_encode_multiplier(0, true), 1.0f);
  EXPECT_EQ(mx_encode_multiplier(0, false), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xff)));
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
}

TEST(Scales, Fp8AndNvfp4FollowTheDocumentedRules) {
  EXPECT_EQ(fp8_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(fp8_encode_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_encode_scale(2.0f), 224.0f);
  EXPECT_EQ(fp8_encode_scale(1e-44f), kFloatMax);
  EXPECT_EQ(nvfp4_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_encode_scale(1e-44f), kFloatMax);
  // Block scale: amax 6 at S_enc 1 is exactly E4M3 1.0; element multiplier then 1.
  EXPECT_EQ(nvfp4_block_scale(6.0f, 1.0f), 0x38);
  EXPECT_EQ(nvfp4_element_multiplier(0x38, 1.0f), 1.0f);
  // A zero block scale gives the clamped multiplier, and its elements decode to zero.
  EXPECT_EQ(nvfp4_element_multiplier(0x00, 1.0f), kFloatMax);
  EXPECT_EQ(nvfp4_decode(0x7, 0x00, 1.0f), 0.0f);
  EXPECT_EQ(nvfp4_decode(0xf, 0x38, 0.5f), -3.0f);
}

}  // namespace
}  // namespace gtp::kernels::codec

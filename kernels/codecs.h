// Scalar codecs of the wire formats: the executable spec. The CPU reference and the CUDA kernels
// both call these functions, and the GPU tests still compare the two bit for bit (different
// compilers, different instruction selection). All arithmetic is FP32 with round-to-nearest-even;
// no expression here may be contracted into an FMA (there are no multiply-adds to contract).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define GTP_HD __host__ __device__ __forceinline__
#else
#define GTP_HD inline
#endif

namespace gtp::kernels::codec {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kFloatMax = 3.40282346638528859812e+38f;
inline constexpr uint8_t kE4M3NaN = 0x7f;  // the one NaN code pack ever writes
inline constexpr uint8_t kE8M0NaN = 0xff;

GTP_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GTP_HD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

GTP_HD bool is_finite(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }
GTP_HD bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }
GTP_HD float abs_value(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }
// max that never returns NaN when one side is a number; both sides are non-negative here.
GTP_HD float max_value(float a, float b) { return b > a ? b : a; }

// ---- BF16 ---------------------------------------------------------------------------------------
GTP_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; every NaN becomes 0x7fff (CUDA's canonical BF16 NaN); overflow gives
// +-Inf.
GTP_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// ---- E4M3 (OCP FP8, "FN": no Inf, NaN = S.1111.111, max 448, min subnormal 2^-9) ---------------
// Round to nearest even, saturating: |x| >= 448 and +-Inf give +-448. NaN gives 0x7f (any sign).
GTP_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kE4M3NaN;
  if (a >= 0x43e00000u) return sign | 0x7e;  // 448.0f
  if (a < 0x3c800000u) {                     // below 2^-6: subnormal codes count units of 2^-9
    // |x| * 512 is exact; rounding it to an integer in [0, 8] gives the code directly (8 is the
    // smallest normal, 2^-6).
    const float units = bits_float(a) * 512.0f;
    uint32_t q = static_cast<uint32_t>(units);
    const float rest = units - static_cast<float>(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: keep the exponent and the top 3 mantissa bits, round the 20 dropped bits to even. A
  // carry out of the mantissa bumps the exponent, which is the right result.
  uint32_t kept = a >> 20;
  const uint32_t dropped = a & 0xfffffu;
  if (dropped > 0x80000u || (dropped == 0x80000u && (kept & 1u))) ++kept;
  return sign | static_cast<uint8_t>(kept - ((127u - 7u) << 3));
}

GTP_HD float e4m3_to_float(uint8_t code) {
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_float(0x7fc00000u);
  const float magnitude = exponent == 0
                              ? static_cast<float>(mantissa) * (1.0f / 512.0f)
                              : bits_float(((exponent + 120u) << 23) | (mantissa << 20));
  return (code & 0x80) ? -magnitude : magnitude;
}

// ---- E2M1 (FP4: 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3) --------------------------------------
// Round to nearest even (ties go to the code with an even last bit), saturating to +-6. The sign
// bit always follows the input, so small negatives give -0 (0x8). NaN never reaches this function:
// a block holding one is encoded as a NaN block (see nvfp4 below).
GTP_HD uint8_t float_to_e2m1(float x) {
  const uint8_t sign = (float_bits(x) >> 31) ? 0x8 : 0x0;
  const float a = abs_value(x);
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

// The same rounding as float_to_e2m1, of a = |x| (finite or +Inf), by FP32 arithmetic that the pack
// kernels run on the FMA pipe. Each E2M1 binade has a fixed step: 0.5 on [0, 2), 1 on [2, 4), 2 on
// [4, inf). The FP32 fma 2^23 + a / step rounds a to that step with round-to-nearest-even, and with
// 2^23 plus the binade's first code (0, 2, 4) as the addend the sum's low bits are the code itself,
// ties on the even code. Of the three candidates the right binade's is the smallest (the others round
// a finer grid that starts lower but counts faster, or a coarser one that starts at a larger code),
// so the smallest candidate's bits are kE2M1CandidateBase + the code, which saturates at 7 (6.0)
// once a reaches 7. codecs_test holds it to float_to_e2m1.
inline constexpr uint32_t kE2M1CandidateBase = 0x4b000000u;  // the bits of 2^23
GTP_HD uint32_t e2m1_candidate(float a) {
  const uint32_t step_half = float_bits(fmaf(a, 2.0f, 8388608.0f));  // 2^23 + 0 + 2a
  const uint32_t step_one = float_bits(fmaf(a, 1.0f, 8388610.0f));   // 2^23 + 2 + a
  const uint32_t step_two = float_bits(fmaf(a, 0.5f, 8388612.0f));   // 2^23 + 4 + a/2
  const uint32_t low = step_half < step_one ? step_half : step_one;
  return low < step_two ? low : step_two;
}

GTP_HD float e2m1_to_float(uint8_t code) {
  const uint32_t magnitude_code = code & 0x7u;
  // 0, 0.5, 1, 1.5 are halves; 2, 3 and 4, 6 are the same mantissas at doubled exponents.
  const float magnitude = magnitude_code < 4 ? 0.5f * static_cast<float>(magnitude_code)
                          : magnitude_code < 6 ? static_cast<float>(magnitude_code - 2)
                                               : 2.0f * static_cast<float>(magnitude_code - 4);
  return (code & 0x8) ? -magnitude : magnitude;
}

// ---- E8M0 block scale of MXFP8 -----------------------------------------------------------------
// RCEIL (TransformerEngine): the power of two at or above amax / 448, from its FP32 bits.
GTP_HD uint8_t e8m0_rceil(float block_amax) {
  const float v = block_amax * (1.0f / kE4M3Max);
  const uint32_t u = float_bits(v);
  if (is_nan(v)) return kE8M0NaN;
  if (!is_finite(v)) return 0xfe;
  if (v == 0.0f) return 0;
  uint32_t exponent = (u >> 23) & 0xffu;
  const uint32_t mantissa = u & 0x7fffffu;
  if (mantissa > 0 && exponent != 0xfeu && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// FLOOR (OCP MX v1.0): 2^(floor(log2(amax)) - 8), 8 being the largest E4M3 exponent; clamped to the
// E8M0 range [2^-127, 2^127]. The block maximum may then exceed 448 and saturates.
GTP_HD uint8_t e8m0_floor(float block_amax) {
  if (block_amax == 0.0f) return 0;
  const uint32_t u = float_bits(block_amax);
  const int32_t field = static_cast<int32_t>((u >> 23) & 0xffu);
  int32_t log2_floor;
  if (field != 0) {
    log2_floor = field - 127;
  } else {  // subnormal amax: position of the leading mantissa bit
    uint32_t m = u & 0x7fffffu;
    int32_t top = -1;
    while (m) { ++top; m >>= 1; }
    log2_floor = top - 149;
  }
  int32_t biased = log2_floor - 8 + 127;
  biased = biased < 0 ? 0 : (biased > 254 ? 254 : biased);
  return static_cast<uint8_t>(biased);
}

// Decoded value of an E8M0 scale: 2^(e-127); 0xff is NaN.
GTP_HD float e8m0_to_float(uint8_t e) {
  if (e == kE8M0NaN) return bits_float(0x7fc00000u);
  if (e == 0) return bits_float(0x00400000u);  // 2^-127 is an FP32 subnormal
  return bits_float(static_cast<uint32_t>(e) << 23);
}

// The multiplier pack applies to elements before the E4M3 cast.
// RCEIL follows TransformerEngine: 1 for e == 0 (amax/448 at most 2^-127: every element is far
// below E4M3's smallest subnormal either way), else exactly 2^(127-e).
// FLOOR uses the exact 2^(127-e) everywhere, so tiny blocks keep their values as OCP intends.
GTP_HD float mx_encode_multiplier(uint8_t e, bool rceil) {
  if (e == 0) return rceil ? 1.0f : bits_float(254u << 23);
  if (e == 254) return bits_float(0x00400000u);
  return bits_float((254u - e) << 23);
}

// ---- FP8 per-tensor scale (current scaling) ----------------------------------------------------
// scale = 448 / amax, 1 when amax is 0, FLT_MAX when the quotient overflows (tiny amax).
GTP_HD float fp8_encode_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float scale = kE4M3Max / amax;
  return scale > kFloatMax ? kFloatMax : scale;
}

// ---- NVFP4 -------------------------------------------------------------------------------------
// Global encode scale S_enc = (448 * 6) / amax, clamped to FLT_MAX; 1 when amax is 0 (or S_enc 0).
GTP_HD float nvfp4_encode_scale(float global_amax) {
  if (global_amax == 0.0f) return 1.0f;
  float s = (kE4M3Max * kE2M1Max) / global_amax;
  if (s > kFloatMax) s = kFloatMax;
  return s == 0.0f ? 1.0f : s;
}

// Block decode scale s_b = E4M3(block_amax * (S_enc * (1/6))), the product in brackets first.
GTP_HD uint8_t nvfp4_block_scale(float block_amax, float encode_scale) {
  const float factor = encode_scale * (1.0f / kE2M1Max);
  return float_to_e4m3(block_amax * factor);
}

// Element multiplier c = min(1 / (float(s_b) * S_dec), FLT_MAX).
GTP_HD float nvfp4_element_multiplier(uint8_t block_scale, float decode_scale) {
  const float c = 1.0f / (e4m3_to_float(block_scale) * decode_scale);
  return c > kFloatMax ? kFloatMax : c;
}

// x^ = (q * float(s_b)) * S_dec.
GTP_HD float nvfp4_decode(uint8_t code, uint8_t block_scale, float decode_scale) {
  return (e2m1_to_float(code) * e4m3_to_float(block_scale)) * decode_scale;
}

}  // namespace gtp::kernels::codec

// The register transposes against a naive element-by-element transpose: every single-element
// matrix (each position with each value) and random matrices.
#include "kernels/transpose.h"

#include <gtest/gtest.h>

#include <random>

namespace gtp::kernels::transpose {
namespace {

template <int kN, int kBits>
uint32_t element(const uint32_t (&m)[kN], int i, int j) {
  return (m[i] >> (kBits * j)) & ((1u << kBits) - 1);
}

// Transposes m with the register routine and checks every element against its mirror.
template <int kN, int kBits, typename Fn>
void expect_transposed(const uint32_t (&m)[kN], Fn transpose_fn) {
  uint32_t t[kN];
  for (int i = 0; i < kN; ++i) t[i] = m[i];
  transpose_fn(t);
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j)
      ASSERT_EQ((element<kN, kBits>(t, j, i)), (element<kN, kBits>(m, i, j)))
          << "element (" << i << ", " << j << ") of a " << kN << "x" << kN << " matrix";
}

template <int kN, int kBits, typename Fn>
void check_all(Fn transpose_fn) {
  // One element set at a time, to every value: catches any misrouted or dropped element.
  for (int i = 0; i < kN; ++i)
    for (int j = 0; j < kN; ++j)
      for (uint32_t v = 1; v < (1u << kBits); ++v) {
        uint32_t m[kN] = {};
        m[i] = v << (kBits * j);
        expect_transposed<kN, kBits>(m, transpose_fn);
      }
  std::mt19937 rng(20261203);
  for (int trial = 0; trial < 100000; ++trial) {
    uint32_t m[kN];
    for (uint32_t& w : m) w = rng();
    expect_transposed<kN, kBits>(m, transpose_fn);
  }
}

TEST(Transpose, ByteHostEmulationMatchesPrmtSemantics) {
  // Selector 0x3210 is the identity on x, 0x7654 on y; 0x0123 reverses x.
  EXPECT_EQ(byte_perm(0x44332211u, 0x88776655u, 0x3210), 0x44332211u);
  EXPECT_EQ(byte_perm(0x44332211u, 0x88776655u, 0x7654), 0x88776655u);
  EXPECT_EQ(byte_perm(0x44332211u, 0x88776655u, 0x0123), 0x11223344u);
  EXPECT_EQ(byte_perm(0x44332211u, 0x88776655u, 0x5140), 0x66225511u);
}

TEST(Transpose, Bytes4x4) { check_all<4, 8>([](uint32_t (&m)[4]) { bytes_4x4(m); }); }

TEST(Transpose, Nibbles8x8) { check_all<8, 4>([](uint32_t (&m)[8]) { nibbles_8x8(m); }); }

}  // namespace
}  // namespace gtp::kernels::transpose

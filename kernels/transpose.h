// In-register transposes of small byte and nibble matrices, the inner step of the GEMM-layout
// unpack kernels that write a transposed copy. Host and device share this code so a CPU test can
// check it exhaustively before a kernel uses it; on the device each permutation is one PRMT.
#pragma once

#include <cstdint>

#include "kernels/codecs.h"  // GTP_HD

namespace gtp::kernels::transpose {

// __byte_perm(x, y, selector) for the selectors used here: byte k of the result is byte
// (selector >> 4k) & 7 of the 8-byte value y:x (no sign-replicate mode).
GTP_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, selector);
#else
  const uint64_t both = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t source = (selector >> (4 * k)) & 7u;
    out |= static_cast<uint32_t>((both >> (8 * source)) & 0xffu) << (8 * k);
  }
  return out;
#endif
}

// 4x4 bytes: byte j of row[i] becomes byte i of row[j] (rows are little-endian words).
GTP_HD void bytes_4x4(uint32_t (&row)[4]) {
  const uint32_t t0 = byte_perm(row[0], row[1], 0x5140), t1 = byte_perm(row[0], row[1], 0x7362);
  const uint32_t t2 = byte_perm(row[2], row[3], 0x5140), t3 = byte_perm(row[2], row[3], 0x7362);
  row[0] = byte_perm(t0, t2, 0x5410);
  row[1] = byte_perm(t0, t2, 0x7632);
  row[2] = byte_perm(t1, t3, 0x5410);
  row[3] = byte_perm(t1, t3, 0x7632);
}

// 8x8 nibbles: nibble j of row[i] becomes nibble i of row[j] (nibble 0 is the low one), in three
// exchanges of halving size: 16-bit halves, bytes, nibbles.
GTP_HD void nibbles_8x8(uint32_t (&row)[8]) {
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = row[i], b = row[i + 4];
    row[i] = byte_perm(a, b, 0x5410);
    row[i + 4] = byte_perm(a, b, 0x7632);
  }
  for (int k = 0; k < 4; ++k) {
    const int i = (k & 1) | ((k & 2) << 1);  // 0, 1, 4, 5
    const uint32_t a = row[i], b = row[i + 2];
    row[i] = byte_perm(a, b, 0x6240);
    row[i + 2] = byte_perm(a, b, 0x7351);
  }
  for (int i = 0; i < 8; i += 2) {
    const uint32_t a = row[i], b = row[i + 1];
    row[i] = (a & 0x0f0f0f0fu) | ((b & 0x0f0f0f0fu) << 4);
    row[i + 1] = ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
  }
}

}  // namespace gtp::kernels::transpose

// Where entry (r, c) of a block-scale matrix lives in the GEMM layout's scales, for the CPU
// reference and the CUDA kernels alike (docs/formats.md, "Blocked scales").
#pragma once

#include <cstdint>

#include "kernels/codecs.h"  // GTP_HD

namespace gtp::kernels {

// Byte offset of scale (r, c) of a matrix with `cols` scale columns. Row-major: r * cols + c.
// Blocked 128x4: the matrix is cut into 128-row x 4-column tiles of 512 bytes, stored tile row by
// tile row (ceil(cols / 4) tiles each); inside a tile, row r sits at (r % 32) * 16 + (r % 128 / 32)
// * 4 and column c at c % 4, so the four 32-row quarters of a tile interleave in 16-byte lines.
GTP_HD int64_t scale_offset(bool blocked, int64_t r, int64_t c, int64_t cols) {
  if (!blocked) return r * cols + c;
  const int64_t tiles_per_row = (cols + 3) / 4;
  return ((r / 128) * tiles_per_row + c / 4) * 512 + (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}

}  // namespace gtp::kernels

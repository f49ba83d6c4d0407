#include "kernels/arguments.h"

#include <sstream>
#include <stdexcept>
#include <string>

namespace gtp::kernels {
namespace {

std::string hex(const void* p) {
  std::ostringstream s;
  s << p;
  return s.str();
}

void check_pointer(const void* p, const char* name, int64_t alignment) {
  if (p == nullptr) {
    throw std::invalid_argument(std::string(name) + " is null: pass a buffer");
  }
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    throw std::invalid_argument(std::string(name) + "=" + hex(p) + " is not " +
                                std::to_string(alignment) +
                                "-byte aligned: allocate it with cudaMalloc or an aligned "
                                "allocator, or offset it by a multiple of " +
                                std::to_string(alignment));
  }
}

void check_capacity(int64_t capacity, int64_t needed, const char* name) {
  if (capacity < needed) {
    throw std::invalid_argument(std::string(name) + "=" + std::to_string(capacity) +
                                " bytes is smaller than the " + std::to_string(needed) +
                                " bytes required: size the buffer from the layout functions");
  }
}

void check_source_dtype(SourceDtype dtype) {
  if (dtype != SourceDtype::kBF16 && dtype != SourceDtype::kFP32) {
    throw std::invalid_argument("unknown source dtype value " +
                                std::to_string(static_cast<int>(dtype)) +
                                ": use SourceDtype::kBF16 or kFP32");
  }
}

void check_spec(const WireSpec& spec) {
  row_alignment(spec.format);  // throws on an unknown format
  if (spec.mx_rounding != ScaleRounding::kRceil && spec.mx_rounding != ScaleRounding::kFloor) {
    throw std::invalid_argument("unknown MXFP8 scale rounding value " +
                                std::to_string(static_cast<int>(spec.mx_rounding)) +
                                ": use ScaleRounding::kRceil or kFloor");
  }
  if (spec.nvfp4_blocks != Nvfp4Blocks::k1D && spec.nvfp4_blocks != Nvfp4Blocks::k2D) {
    throw std::invalid_argument("unknown NVFP4 block shape value " +
                                std::to_string(static_cast<int>(spec.nvfp4_blocks)) +
                                ": use Nvfp4Blocks::k1D or k2D");
  }
}

ChunkLayout check_gathered(const WireSpec& spec, const GatheredChunks& in) {
  check_spec(spec);
  const WeightGeometry expected =
      weight_geometry(spec.format, in.geometry.rows, in.geometry.cols, in.geometry.group_size);
  if (expected.shard_rows != in.geometry.shard_rows ||
      expected.padded_rows != in.geometry.padded_rows) {
    throw std::invalid_argument(
        "geometry shard_rows=" + std::to_string(in.geometry.shard_rows) + ", padded_rows=" +
        std::to_string(in.geometry.padded_rows) + " do not match rows=" +
        std::to_string(in.geometry.rows) + ", G=" + std::to_string(in.geometry.group_size) +
        " for " + to_string(spec.format) + " (expected shard_rows=" +
        std::to_string(expected.shard_rows) + "): build it with weight_geometry()");
  }
  const ChunkLayout layout = chunk_layout(spec, in.geometry.shard_rows, in.geometry.cols);
  check_pointer(in.chunks, "chunks", kPointerAlignment);
  check_capacity(in.capacity, layout.chunk_bytes * in.geometry.group_size, "chunks capacity");
  return layout;
}

}  // namespace

ChunkLayout validate_pack(const WireSpec& spec, const PackArgs& args) {
  check_spec(spec);
  check_source_dtype(args.src_dtype);
  const ChunkLayout layout = chunk_layout(spec, args.shard_rows, args.cols);
  if (args.valid_rows < 0 || args.valid_rows > args.shard_rows) {
    throw std::invalid_argument("valid_rows=" + std::to_string(args.valid_rows) +
                                " is outside [0, shard_rows=" + std::to_string(args.shard_rows) +
                                "]: take it from WeightGeometry::valid_rows(rank)");
  }
  if (args.valid_rows > 0) check_pointer(args.shard, "shard", kPointerAlignment);
  check_pointer(args.chunk, "chunk", kPointerAlignment);
  check_capacity(args.chunk_capacity, layout.chunk_bytes, "chunk_capacity");
  if (args.amax != nullptr && reinterpret_cast<uintptr_t>(args.amax) % alignof(float) != 0) {
    throw std::invalid_argument("amax=" + hex(args.amax) + " is not 4-byte aligned");
  }
  return layout;
}

ChunkLayout validate_unpack(const WireSpec& spec, const GatheredChunks& in, const void* out,
                            int64_t out_capacity) {
  const ChunkLayout layout = check_gathered(spec, in);
  check_pointer(out, "out", kPointerAlignment);
  check_capacity(out_capacity, in.geometry.rows * in.geometry.cols * 2, "out capacity");
  return layout;
}

void validate_unpack_many(const WireSpec& spec, const UnpackJob* jobs, int64_t n) {
  if (n < 0) {
    throw std::invalid_argument("unpack job count n=" + std::to_string(n) +
                                " is negative: pass the number of jobs (0 does nothing)");
  }
  if (n > 0 && jobs == nullptr) {
    throw std::invalid_argument("unpack jobs is null with n=" + std::to_string(n) +
                                ": pass an array of n UnpackJob");
  }
  for (int64_t i = 0; i < n; ++i) {
    try {
      validate_unpack(spec, jobs[i].in, jobs[i].out_bf16, jobs[i].out_capacity);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("unpack job " + std::to_string(i) + " of " + std::to_string(n) +
                                  ": " + e.what());
    }
  }
}

ChunkLayout validate_unpack_gemm(const WireSpec& spec, const GatheredChunks& in,
                                 const GemmOutputs& out) {
  const ChunkLayout layout = check_gathered(spec, in);
  if (spec.format == WireFormat::kBF16) {
    throw std::invalid_argument(
        "the bf16 wire format has no quantized GEMM layout: unpack it to the BF16 weight");
  }
  const GemmLayoutSizes sizes = gemm_layout_sizes(spec, in.geometry, out.scale_layout);
  check_pointer(out.data, "data", kPointerAlignment);
  check_capacity(out.data_capacity, sizes.data_bytes, "data capacity");
  if (sizes.scales_bytes > 0) {
    check_pointer(out.scales, "scales", kPointerAlignment);
    check_capacity(out.scales_capacity, sizes.scales_bytes, "scales capacity");
  }
  if (out.transposed_data != nullptr) {
    if (!sizes.transpose_supported) {
      throw std::invalid_argument(
          "a transposed copy was requested, but " + to_string(spec.format) +
          (spec.format == WireFormat::kNVFP4 ? " with 1D blocks" : "") +
          " cannot be transposed exactly (its scale blocks run along rows): pass "
          "transposed_data=null" +
          (spec.format == WireFormat::kNVFP4 ? ", or use NVFP4 with 2D (16x16) blocks" : ""));
    }
    check_pointer(out.transposed_data, "transposed_data", kPointerAlignment);
    check_capacity(out.transposed_data_capacity, sizes.transposed_data_bytes,
                   "transposed_data capacity");
    if (sizes.transposed_scales_bytes > 0) {
      check_pointer(out.transposed_scales, "transposed_scales", kPointerAlignment);
      check_capacity(out.transposed_scales_capacity, sizes.transposed_scales_bytes,
                     "transposed_scales capacity");
    }
  }
  if (sizes.decode_scale_count > 0) {
    check_pointer(out.decode_scales, "decode_scales", alignof(float));
    if (out.decode_scales_capacity < sizes.decode_scale_count) {
      throw std::invalid_argument("decode_scales_capacity=" +
                                  std::to_string(out.decode_scales_capacity) +
                                  " entries is fewer than G=" +
                                  std::to_string(sizes.decode_scale_count) +
                                  ": one FP32 decode scale per chunk is written");
    }
  }
  return layout;
}

void validate_amax_input(const void* src, SourceDtype dtype, int64_t rows, int64_t cols,
                         const float* amax_out) {
  check_source_dtype(dtype);
  if (rows < 0 || cols <= 0) {
    throw std::invalid_argument("amax over rows=" + std::to_string(rows) + ", cols=" +
                                std::to_string(cols) +
                                ": rows must be >= 0 and cols positive");
  }
  if (rows > 0) check_pointer(src, "src", kPointerAlignment);
  check_pointer(amax_out, "amax_out", alignof(float));
}

}  // namespace gtp::kernels

// CPU references for the CUDA backend's tests on a size-1 group: a device buffer read back, a G = 1
// chunk packed by the CPU reference, and twelve quantized weights (FP32 shards on the device, FP8,
// NVFP4 2D and MXFP8 FLOOR in turn, of assorted shapes) with their reference BF16 decodes.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/reference.h"
#include "kernels/wire_format.h"
#include "remat/runtime.h"

namespace gtp::remat::testing {

inline std::vector<unsigned char> to_host(const void* device, std::int64_t bytes) {
  std::vector<unsigned char> host(bytes);
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

// The CPU reference of a G = 1 weight's chunk: the FP32 weight `full` packed with its own amax.
inline std::vector<unsigned char> reference_chunk(const kernels::WireSpec& spec, const std::vector<float>& full,
                                                  std::int64_t rows, std::int64_t cols, const kernels::ChunkLayout& layout) {
  const auto geometry = kernels::weight_geometry(spec.format, rows, cols, 1);
  const float amax = kernels::amax_reference(full.data(), kernels::SourceDtype::kFP32, rows, cols);
  std::vector<unsigned char> chunk(layout.chunk_bytes);
  kernels::PackArgs args;
  args.shard = full.data();
  args.src_dtype = kernels::SourceDtype::kFP32;
  args.shard_rows = geometry.shard_rows;
  args.valid_rows = rows;
  args.cols = cols;
  args.amax = &amax;
  args.chunk = chunk.data();
  args.chunk_capacity = layout.chunk_bytes;
  kernels::pack_reference(spec, args);
  return chunk;
}

// Twelve FP32 weights of three quantized wires (ragged rows, four widths) registered with `runtime`,
// each with the CPU reference of its BF16 unpack (packed with its own amax: G = 1).
struct ReferenceWeights {
  static constexpr int kCount = 12;
  const kernels::WireSpec specs[3] = {
      {kernels::WireFormat::kFP8},
      {kernels::WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k2D},
      {kernels::WireFormat::kMXFP8, kernels::ScaleRounding::kFloor}};
  std::vector<WeightId> ids;
  std::vector<float*> shards;
  std::vector<std::vector<std::uint16_t>> expected;

  explicit ReferenceWeights(Runtime& runtime) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int i = 0; i < kCount; ++i) {
      const kernels::WireSpec& spec = specs[i % 3];
      const std::int64_t rows = 8 + 37 * i, cols = 64 * (1 + i % 4);
      std::vector<float> full(rows * cols);
      for (float& v : full) v = normal(rng);
      float* shard = nullptr;
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&shard), full.size() * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(shard, full.data(), full.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      shards.push_back(shard);
      WeightDesc desc;
      desc.name = "weight" + std::to_string(i);
      desc.shard = shard;
      desc.dtype = kernels::SourceDtype::kFP32;
      desc.rows = rows;
      desc.cols = cols;
      desc.wire = spec;
      ids.push_back(runtime.register_weight(desc));
      const auto geometry = kernels::weight_geometry(spec.format, rows, cols, 1);
      const kernels::ChunkLayout layout = runtime.registry().get(ids.back()).layout;
      std::vector<unsigned char> chunk = reference_chunk(spec, full, rows, cols, layout);
      expected.emplace_back(rows * cols);
      kernels::unpack_reference(spec, {chunk.data(), layout.chunk_bytes, geometry}, expected.back().data(),
                                rows * cols * 2);
    }
  }
  ~ReferenceWeights() {
    for (float* shard : shards) cudaFree(shard);
  }
  // Weight i's materialized BF16 against its reference, every byte.
  void expect_equal(std::size_t i, const void* device, const std::string& when) const {
    const auto got = to_host(device, static_cast<std::int64_t>(expected[i].size() * 2));
    EXPECT_EQ(std::memcmp(got.data(), expected[i].data(), got.size()), 0)
        << "weight " << i << " (" << kernels::to_string(specs[i % 3]) << ") " << when;
  }
};

}  // namespace gtp::remat::testing

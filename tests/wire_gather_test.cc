// Across components: the path of one weight's materialization on the host backend, put together
// from the public pieces only. Every rank packs its shard of a random weight (FP8 and NVFP4 with
// the group-reduced amax from one all-reduce-max), one all-gather over the real UCX host transport
// moves the wire chunks, and every rank's unpacked weight must equal the single-process reference
// bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/host.h"
#include "comm/thread_bootstrap.h"
#include "kernels/internal/test_data.h"
#include "kernels/reference.h"

namespace gtp {
namespace {

using kernels::testing::AlignedBytes;
using kernels::testing::random_weight;
using kernels::testing::shard_bytes;

constexpr std::chrono::milliseconds kTimeout{30000};

// Single-process truth: pack every shard with the weight's amax, unpack the chunks.
std::vector<uint8_t> reference_weight(const kernels::WireSpec& spec, const std::vector<float>& w,
                                      const kernels::WeightGeometry& g, const float* amax) {
  const kernels::ChunkLayout l = kernels::chunk_layout(spec, g.shard_rows, g.cols);
  AlignedBytes chunks(l.chunk_bytes * g.group_size);
  for (int64_t rank = 0; rank < g.group_size; ++rank) {
    AlignedBytes shard = shard_bytes(w, g.cols, rank * g.shard_rows, g.valid_rows(rank),
                                     kernels::SourceDtype::kBF16);
    kernels::PackArgs a;
    a.shard = shard.data();
    a.shard_rows = g.shard_rows;
    a.valid_rows = g.valid_rows(rank);
    a.cols = g.cols;
    a.amax = amax;
    a.chunk = chunks.data() + rank * l.chunk_bytes;
    a.chunk_capacity = l.chunk_bytes;
    kernels::pack_reference(spec, a);
  }
  AlignedBytes out(g.rows * g.cols * 2);
  kernels::unpack_reference(spec, {chunks.data(), l.chunk_bytes * g.group_size, g}, out.data(),
                            g.rows * g.cols * 2);
  return std::vector<uint8_t>(out.data(), out.data() + g.rows * g.cols * 2);
}

void materialize_on_every_rank(const kernels::WireSpec& spec, int world) {
  const int64_t rows = 200, cols = 96;
  const std::vector<float> w = random_weight(rows, cols, 17 + world);
  const kernels::WeightGeometry g = kernels::weight_geometry(spec.format, rows, cols, world);
  const kernels::ChunkLayout l = kernels::chunk_layout(spec, g.shard_rows, cols);
  const bool tensor_scaled =
      spec.format == kernels::WireFormat::kFP8 || spec.format == kernels::WireFormat::kNVFP4;

  auto bootstraps = comm::ThreadBootstrap::create_group(world, kTimeout);
  std::vector<std::vector<uint8_t>> results(world);
  std::vector<float> reduced_amax(world, -1.0f);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      comm::HostComm host(*bootstraps[rank], kTimeout);
      AlignedBytes shard = shard_bytes(w, cols, rank * g.shard_rows, g.valid_rows(rank),
                                       kernels::SourceDtype::kBF16);
      float amax = kernels::amax_reference(shard.data(), kernels::SourceDtype::kBF16,
                                           g.valid_rows(rank), cols);
      host.all_reduce_max(&amax, 1);
      reduced_amax[rank] = amax;
      AlignedBytes chunks(l.chunk_bytes * world);
      kernels::PackArgs a;
      a.shard = shard.data();
      a.shard_rows = g.shard_rows;
      a.valid_rows = g.valid_rows(rank);
      a.cols = cols;
      a.amax = tensor_scaled ? &amax : nullptr;
      a.chunk = chunks.data() + rank * l.chunk_bytes;  // packed in place in the gather buffer
      a.chunk_capacity = l.chunk_bytes;
      kernels::pack_reference(spec, a);
      host.all_gather(a.chunk, chunks.data(), l.chunk_bytes);  // one collective per weight
      AlignedBytes out(rows * cols * 2);
      kernels::unpack_reference(spec, {chunks.data(), l.chunk_bytes * world, g}, out.data(),
                                rows * cols * 2);
      results[rank].assign(out.data(), out.data() + rows * cols * 2);
    });
  }
  for (auto& t : ranks) t.join();

  float global_amax = 0.0f;
  for (float x : w) global_amax = std::max(global_amax, std::fabs(kernels::codec::bf16_to_float(
                                                           kernels::codec::float_to_bf16(x))));
  const std::vector<uint8_t> expected =
      reference_weight(spec, w, g, tensor_scaled ? &global_amax : nullptr);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(reduced_amax[rank], global_amax) << "rank " << rank;
    ASSERT_EQ(results[rank].size(), expected.size());
    EXPECT_EQ(std::memcmp(results[rank].data(), expected.data(), expected.size()), 0)
        << kernels::to_string(spec.format) << " rank " << rank << " of " << world;
  }
}

TEST(WireGather, EveryFormatMaterializesBitExactOverTheHostTransport) {
  const kernels::WireSpec specs[] = {
      {kernels::WireFormat::kBF16},
      {kernels::WireFormat::kFP8},
      {kernels::WireFormat::kMXFP8, kernels::ScaleRounding::kRceil},
      {kernels::WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k2D},
  };
  for (const auto& spec : specs) {
    for (int world : {2, 3}) materialize_on_every_rank(spec, world);
  }
}

}  // namespace
}  // namespace gtp

// A BF16 shard on the BF16 wire, of which a rank holds every row, is sent as it is: no chunk is
// allocated for it and a re-pack packs nothing, yet every gather reads the shard as of the latest
// shard_updated. Ranks as threads over UCX (HostComm), on the host backend, freed slots poisoned.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/codecs.h"
#include "remat/host_backend.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

constexpr std::chrono::milliseconds kTimeout{60000};
constexpr int kRanks = 2;
constexpr std::int64_t kCols = 16;

struct TestWeight {
  const char* name;
  std::int64_t rows;
  kernels::SourceDtype dtype;
};

// 32 rows: both ranks hold 16 valid rows. 49 rows: padded to 64, 32 per rank, of which rank 1 holds
// 17 and 15 padding rows, so it packs (the padding zeroed in its chunk). FP32: the wire is a cast,
// packed everywhere.
const TestWeight kWeights[] = {{"bf16_even", 32, kernels::SourceDtype::kBF16},
                               {"bf16_padded", 48 + 1, kernels::SourceDtype::kBF16},
                               {"fp32_even", 32, kernels::SourceDtype::kFP32}};

bool sends_from_shard(const TestWeight& w, int rank) {
  const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, w.rows, kCols, kRanks);
  return w.dtype == kernels::SourceDtype::kBF16 && geometry.valid_rows(rank) == geometry.shard_rows;
}

// The full weight of one step (distinct per step and weight).
std::vector<float> full_weight(int weight, int step) {
  std::mt19937 random(static_cast<unsigned>(1000 * step + weight));
  std::uniform_int_distribution<int> value(-512, 512);
  std::vector<float> out(static_cast<std::size_t>(kWeights[weight].rows * kCols));
  for (float& v : out) v = static_cast<float>(value(random)) / 64.0f;
  return out;
}

// One rank's shard of a weight: its valid rows, in the weight's source dtype.
class Shard {
 public:
  Shard(int weight, int rank) : weight_(weight), rank_(rank) {
    const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, kWeights[weight].rows, kCols, kRanks);
    first_row_ = rank * geometry.shard_rows;
    valid_rows_ = geometry.valid_rows(rank);
    bytes_.resize(static_cast<std::size_t>(valid_rows_ * kCols) * element_bytes());
  }
  // Writes the rows of step `step`'s weight, as an optimizer step would.
  void write(int step) {
    const std::vector<float> full = full_weight(weight_, step);
    for (std::int64_t i = 0; i < valid_rows_ * kCols; ++i) {
      const float v = full[static_cast<std::size_t>(first_row_ * kCols + i)];
      if (kWeights[weight_].dtype == kernels::SourceDtype::kFP32) {
        std::memcpy(bytes_.data() + 4 * i, &v, 4);
      } else {
        const std::uint16_t b = kernels::codec::float_to_bf16(v);
        std::memcpy(bytes_.data() + 2 * i, &b, 2);
      }
    }
  }
  const void* data() const { return bytes_.data(); }

 private:
  std::size_t element_bytes() const { return kWeights[weight_].dtype == kernels::SourceDtype::kFP32 ? 4 : 2; }
  int weight_, rank_;
  std::int64_t first_row_ = 0, valid_rows_ = 0;
  std::vector<unsigned char> bytes_;
};

void expect_weight(const void* data, int weight, int step) {
  const std::vector<float> full = full_weight(weight, step);
  const auto* bits = static_cast<const std::uint16_t*>(data);
  int wrong = 0;
  for (std::size_t i = 0; i < full.size(); ++i) wrong += bits[i] != kernels::codec::float_to_bf16(full[i]);
  EXPECT_EQ(wrong, 0) << kWeights[weight].name << " at step " << step;
}

TEST(ShardSend, Bf16ShardsAreSentAsTheyAreAndEveryGatherReadsTheLatestShardUpdate) {
  auto group = comm::ThreadBootstrap::create_group(kRanks, kTimeout);
  comm::internal::rethrow_first(comm::internal::run_ranks(kRanks, [&](int rank) {
    comm::HostComm comm(*group[rank], kTimeout);
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 2;
    config.cache.poison_released = true;
    Runtime runtime(backend, config);
    std::vector<Shard> shards;
    std::vector<WeightId> ids;
    for (int w = 0; w < 3; ++w) {
      shards.emplace_back(w, rank);
      shards.back().write(0);
      WeightDesc desc;
      desc.name = kWeights[w].name;
      desc.shard = shards.back().data();
      desc.dtype = kWeights[w].dtype;
      desc.rows = kWeights[w].rows;
      desc.cols = kCols;
      // A weight without its own chunk allocates nothing at registration; the others their chunk.
      const std::int64_t before = backend.memory().bytes_in_use;
      ids.push_back(runtime.register_weight(desc));
      const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, desc.rows, kCols, kRanks);
      const std::int64_t chunk = kernels::chunk_layout({}, geometry.shard_rows, kCols).chunk_bytes;
      EXPECT_EQ(backend.memory().bytes_in_use - before, sends_from_shard(kWeights[w], rank) ? 0 : chunk)
          << desc.name << " on rank " << rank;
    }
    EXPECT_TRUE(sends_from_shard(kWeights[0], rank));                    // the case is not vacuous
    EXPECT_NE(sends_from_shard(kWeights[1], 0), sends_from_shard(kWeights[1], 1));  // one rank pads
    runtime.shard_updated(ids.data(), 3, nullptr);
    for (int step = 0; step < 4; ++step) {
      for (int w = 0; w < 3; ++w) {
        expect_weight(runtime.materialize(&ids[w], 1, Phase::kForward, 0, Layout::kBF16, nullptr)[0], w, step);
        runtime.release(&ids[w], 1, nullptr);
      }
      for (int w = 2; w >= 0; --w) {
        expect_weight(runtime.materialize(&ids[w], 1, Phase::kBackward, 0, Layout::kBF16, nullptr)[0], w, step);
        runtime.release(&ids[w], 1, nullptr);
      }
      // The head is prefetched at drain from the shards of this step; the optimizer then writes the
      // next step's, and the re-pack gathers the head again from them.
      runtime.drain(nullptr);
      for (Shard& shard : shards) shard.write(step + 1);
      runtime.shard_updated(ids.data(), 3, nullptr);
    }
    EXPECT_EQ(runtime.stats().stale_prefetches, 4 * config.depth) << "the head re-gathered after each update";
    EXPECT_GT(runtime.stats().prefetch_hits, 0);
  }));
}

}  // namespace
}  // namespace gtp::remat

// Lazy re-packs on the host backend, ranks as threads over UCX: shard_updated reduces the amax and each
// chunk is packed at its first gather after it. A weight left pending while other weights are updated
// again keeps its own amax (each weight has its own amax slot), and every weight materializes to the
// CPU reference of its latest shards, bit for bit. The slots stay put whatever the order and subset of
// later updates (a pack captured into a CUDA graph reads the same address on every replay), survive
// the array's growth, and are reused after unregistration.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/reference.h"
#include "remat/host_backend.h"
#include "testing/remat/test_model.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

constexpr std::chrono::milliseconds kTimeout{60000};
constexpr std::int64_t kRows = 48, kCols = 64;

// Weight w's full FP32 values after its update number `version` (a different scale each, so that the
// amax, and so the encoding, differ between weights and updates).
std::vector<float> full_weight(int w, int version) {
  std::mt19937 random(static_cast<unsigned>(31 * w + version));
  std::normal_distribution<float> normal(0.0f, 1.0f + 3.0f * w + 5.0f * version);
  std::vector<float> out(kRows * kCols);
  for (float& v : out) v = normal(random);
  return out;
}

// Registers weight w: an FP32 shard of the kRows x kCols weight on `spec`.
WeightId register_weight(Runtime& runtime, int w, const float* shard, kernels::WireSpec spec) {
  WeightDesc desc;
  desc.name = "w" + std::to_string(w);
  desc.shard = shard;
  desc.dtype = kernels::SourceDtype::kFP32;
  desc.rows = kRows;
  desc.cols = kCols;
  desc.wire = spec;
  return runtime.register_weight(desc);
}

// Materializes `id` and expects the CPU reference of the full weight `full`, bit for bit.
void expect_materializes_to(Runtime& runtime, WeightId id, kernels::WireSpec spec, const std::vector<float>& full,
                            const kernels::WeightGeometry& geometry, const std::string& what) {
  const kernels::ChunkLayout layout = runtime.registry().get(id).layout;
  const std::vector<unsigned char> chunks = testing::reference_chunks(spec, full, geometry, layout);
  std::vector<std::uint16_t> expected(kRows * kCols);
  kernels::unpack_reference(spec, kernels::GatheredChunks{chunks.data(), 2 * layout.chunk_bytes, geometry},
                            expected.data(), kRows * kCols * 2);
  const auto out = runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, nullptr);
  EXPECT_EQ(std::memcmp(out[0], expected.data(), expected.size() * 2), 0) << what;
  runtime.release(&id, 1, nullptr);
}

TEST(Repack, AWeightLeftPendingKeepsItsOwnAmaxWhileOthersAreUpdatedAgain) {
  for (const kernels::WireSpec spec : {kernels::WireSpec{kernels::WireFormat::kFP8},
                                       kernels::WireSpec{kernels::WireFormat::kNVFP4}}) {
    SCOPED_TRACE(kernels::to_string(spec));
    auto group = comm::ThreadBootstrap::create_group(2, kTimeout);
    comm::internal::rethrow_first(comm::internal::run_ranks(2, [&](int rank) {
      comm::HostComm comm(*group[rank], kTimeout);
      HostBackend backend({&comm});
      Runtime runtime(backend, RuntimeConfig{});
      const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, 2);
      const std::int64_t first = rank * geometry.shard_rows * kCols;
      const std::int64_t valid = geometry.valid_rows(rank) * kCols;
      std::vector<std::vector<float>> shards(3, std::vector<float>(static_cast<std::size_t>(std::max<std::int64_t>(valid, 1))));
      std::vector<int> versions(3, 0);
      std::vector<WeightId> ids;
      for (int w = 0; w < 3; ++w) ids.push_back(register_weight(runtime, w, shards[w].data(), spec));
      const auto write = [&](int w) {  // the optimizer's step on weight w
        const std::vector<float> full = full_weight(w, ++versions[w]);
        std::copy(full.begin() + first, full.begin() + first + valid, shards[w].begin());
      };
      const auto expect_current = [&](int w, const std::string& when) {
        expect_materializes_to(runtime, ids[w], spec, full_weight(w, versions[w]), geometry,
                               "weight " + std::to_string(w) + ", " + when);
      };
      for (int w = 0; w < 3; ++w) write(w);
      runtime.shard_updated(ids.data(), 3, nullptr);
      expect_current(0, "first update");
      // w1 and w2 are still pending while w2 and w0 are updated again, in another order.
      write(2);
      write(0);
      const WeightId again[] = {ids[2], ids[0]};
      runtime.shard_updated(again, 2, nullptr);
      expect_current(1, "pending through another update");
      expect_current(2, "second update");
      expect_current(0, "second update");
      runtime.drain(nullptr);
      EXPECT_EQ(runtime.registry().get(ids[1]).version, 1u);
      EXPECT_EQ(runtime.registry().get(ids[0]).version, 2u);
    }));
  }
}

// The max over ranks of weight w's local |values| at `version` (what its amax slot must hold).
float reduced_amax(int w, int version, std::int64_t rows_per_rank, int ranks) {
  const std::vector<float> full = full_weight(w, version);
  float out = 0.0f;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(rows_per_rank * ranks, kRows) * kCols; ++i) {
    out = std::max(out, std::fabs(full[static_cast<std::size_t>(i)]));
  }
  return out;
}

TEST(Repack, EachWeightKeepsItsAmaxSlotThroughUpdatesInAnyOrderGrowthAndReuse) {
  const kernels::WireSpec spec{kernels::WireFormat::kFP8};
  auto group = comm::ThreadBootstrap::create_group(2, kTimeout);
  comm::internal::rethrow_first(comm::internal::run_ranks(2, [&](int rank) {
    comm::HostComm comm(*group[rank], kTimeout);
    HostBackend backend({&comm});
    Runtime runtime(backend, RuntimeConfig{});
    const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, 2);
    const std::int64_t first = rank * geometry.shard_rows * kCols;
    const std::int64_t valid = geometry.valid_rows(rank) * kCols;
    constexpr int kWeights = 70;  // more than one array's first capacity (64 slots)
    std::vector<std::vector<float>> shards(kWeights, std::vector<float>(static_cast<std::size_t>(valid)));
    std::vector<int> versions(kWeights, 1);
    std::vector<WeightId> ids;
    const auto write = [&](int w, int version) {
      versions[w] = version;
      const std::vector<float> full = full_weight(w, version);
      std::copy(full.begin() + first, full.begin() + first + valid, shards[w].begin());
    };
    const auto add = [&](int w) {
      write(w, versions[w]);
      return register_weight(runtime, w, shards[w].data(), spec);
    };
    const auto expect_amax = [&](int w, const std::string& when) {
      EXPECT_EQ(*runtime.registry().amax_of(ids[w]), reduced_amax(w, versions[w], geometry.shard_rows, 2))
          << "weight " << w << ", " << when;
    };
    for (int w = 0; w < 3; ++w) ids.push_back(add(w));
    runtime.shard_updated(ids.data(), 3, nullptr);
    std::vector<const float*> slots;
    for (int w = 0; w < 3; ++w) slots.push_back(runtime.registry().amax_of(ids[w]));
    for (int w = 0; w < 3; ++w) expect_amax(w, "first update");

    write(2, 2);  // a subset, then every weight in reverse order: the slots stay, each with its own value
    runtime.shard_updated(&ids[2], 1, nullptr);
    for (int w = 0; w < 3; ++w) expect_amax(w, "w2 alone");
    for (int w = 0; w < 3; ++w) write(w, versions[w] + 1);
    const WeightId reversed[] = {ids[2], ids[1], ids[0]};
    runtime.shard_updated(reversed, 3, nullptr);
    for (int w = 0; w < 3; ++w) {
      EXPECT_EQ(runtime.registry().amax_of(ids[w]), slots[w]) << "weight " << w << "'s amax slot moved";
      expect_amax(w, "reversed order");
    }

    // Growth: registering past the first 64 slots moves the array but keeps every value.
    for (int w = 3; w < kWeights; ++w) ids.push_back(add(w));
    for (int w = 0; w < 3; ++w) expect_amax(w, "after the array grew");
    runtime.shard_updated(&ids[kWeights - 1], 1, nullptr);
    expect_amax(kWeights - 1, "a weight beyond the first capacity");

    // An unregistered weight's slot goes to the next weight registered; the neighbours keep theirs.
    const float* freed = runtime.registry().amax_of(ids[1]);
    runtime.unregister_weight(ids[1]);
    versions[1] = 7;
    ids[1] = add(1);
    EXPECT_EQ(runtime.registry().amax_of(ids[1]), freed);
    runtime.shard_updated(&ids[1], 1, nullptr);
    for (int w : {0, 1, 2}) expect_amax(w, "after the slot was reused");
    // The weights' encodings follow: each materializes to the CPU reference of its current shards.
    for (int w : {0, 1, 2}) {
      expect_materializes_to(runtime, ids[w], spec, full_weight(w, versions[w]), geometry,
                             "weight " + std::to_string(w));
    }
    runtime.drain(nullptr);
  }));
}

}  // namespace
}  // namespace gtp::remat

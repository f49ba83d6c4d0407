// Lazy re-packs on the host backend, ranks as threads over UCX: shard_updated reduces the amax and each
// chunk is packed at its first gather after it. A weight left pending while other weights are updated
// again keeps its own amax (its pack is enqueued before the shared scratch is reused), and every weight
// materializes to the CPU reference of its latest shards, bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/reference.h"
#include "remat/host_backend.h"
#include "remat/internal/test_model.h"
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
      for (int w = 0; w < 3; ++w) {
        WeightDesc desc;
        desc.name = "w" + std::to_string(w);
        desc.shard = shards[w].data();
        desc.dtype = kernels::SourceDtype::kFP32;
        desc.rows = kRows;
        desc.cols = kCols;
        desc.wire = spec;
        ids.push_back(runtime.register_weight(desc));
      }
      const auto write = [&](int w) {  // the optimizer's step on weight w
        const std::vector<float> full = full_weight(w, ++versions[w]);
        std::copy(full.begin() + first, full.begin() + first + valid, shards[w].begin());
      };
      const auto expect_current = [&](int w, const std::string& when) {
        const kernels::ChunkLayout layout = runtime.registry().get(ids[w]).layout;
        const std::vector<unsigned char> chunks =
            testing::reference_chunks(spec, full_weight(w, versions[w]), geometry, layout);
        std::vector<std::uint16_t> expected(kRows * kCols);
        kernels::unpack_reference(spec, kernels::GatheredChunks{chunks.data(), 2 * layout.chunk_bytes, geometry},
                                  expected.data(), kRows * kCols * 2);
        const auto out = runtime.materialize(&ids[w], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
        EXPECT_EQ(std::memcmp(out[0], expected.data(), expected.size() * 2), 0) << "weight " << w << ", " << when;
        runtime.release(&ids[w], 1, nullptr);
      };
      for (int w = 0; w < 3; ++w) write(w);
      runtime.shard_updated(ids.data(), 3, nullptr);  // amax scratch: w0, w1, w2
      expect_current(0, "first update");
      // w1 and w2 are still pending; the next update takes the scratch's first places for w2 and w0.
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

}  // namespace
}  // namespace gtp::remat

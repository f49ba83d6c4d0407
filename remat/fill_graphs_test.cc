// Fill graphs (GroupConfig::fill_graphs) on the host backend, ranks as threads over UCX (HostComm):
// the host backend records a fill's work (its all-gathers included) and makes the same calls again at
// each launch, so a graph launched for the wrong slot or key, or with an address that moved, shows as
// wrong bits. Every materialize is compared bit for bit with a twin runtime that fills eagerly, over
// every wire format and both layouts; freed slots are poisoned.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "remat/host_backend.h"
#include "testing/remat/test_model.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using testing::on_ranks;

// The same weights registered with two runtimes on one backend: `graphs` fills through fill graphs,
// `eager` does not. Each layer is one weight of its own wire; FP32 shards, so every wire packs.
class Twins {
 public:
  Twins(comm::HostComm& comm, RuntimeConfig config, const std::vector<std::int64_t>& rows)
      : comm_(comm), backend_({&comm}), graphs_(backend_, with_graphs(config)), eager_(backend_, without_graphs(config)) {
    const std::vector<kernels::WireSpec> wires = testing::all_wire_specs();
    for (std::size_t l = 0; l < rows.size(); ++l) {
      WeightDesc desc;
      desc.name = "layer" + std::to_string(l);
      desc.dtype = kernels::SourceDtype::kFP32;
      desc.rows = rows[l];
      desc.cols = 64;
      desc.wire = wires[l % wires.size()];
      const auto geometry = kernels::weight_geometry(desc.wire.format, desc.rows, desc.cols, comm.size());
      shards_.emplace_back(std::max<std::int64_t>(geometry.valid_rows(comm.rank()), 1) * desc.cols);
      desc.shard = shards_.back().data();
      graph_ids_.push_back(graphs_.register_weight(desc));
      eager_ids_.push_back(eager_.register_weight(desc));
    }
  }

  // New shard values (as an optimizer step writes them), re-packed by both runtimes.
  void update(int step) {
    std::mt19937 random(static_cast<unsigned>(17 * step + comm_.rank()));
    std::normal_distribution<float> normal(0.0f, 1.0f + step);
    for (std::vector<float>& shard : shards_) {
      for (float& v : shard) v = normal(random);
    }
    graphs_.shard_updated(graph_ids_.data(), static_cast<std::int64_t>(graph_ids_.size()), nullptr);
    eager_.shard_updated(eager_ids_.data(), static_cast<std::int64_t>(eager_ids_.size()), nullptr);
  }

  // Materializes layer l in both runtimes and compares every byte of every section.
  void use(int l, Phase phase, Layout layout) {
    const auto got = graphs_.materialize_views(&graph_ids_[l], 1, phase, 0, layout, nullptr);
    const auto want = eager_.materialize_views(&eager_ids_[l], 1, phase, 0, layout, nullptr);
    ASSERT_EQ(got.size(), 1u);
    const Materialized& g = got[0];
    const Materialized& w = want[0];
    const std::string what = "layer " + std::to_string(l) + " " + kernels::to_string(g.wire) +
                             (layout == Layout::kGemm ? " gemm" : " bf16");
    if (g.layout == Layout::kBF16) {
      EXPECT_EQ(std::memcmp(g.data, w.data, static_cast<std::size_t>(g.rows * g.cols * 2)), 0) << what;
    } else {
      const kernels::GemmLayoutSizes& s = g.gemm;
      EXPECT_EQ(std::memcmp(g.data, w.data, static_cast<std::size_t>(s.data_bytes)), 0) << what << " data";
      if (s.scales_bytes > 0) EXPECT_EQ(std::memcmp(g.scales, w.scales, s.scales_bytes), 0) << what << " scales";
      if (g.transposed_data != nullptr) {
        EXPECT_EQ(std::memcmp(g.transposed_data, w.transposed_data, s.transposed_data_bytes), 0) << what;
      }
      if (s.decode_scale_count > 0) {
        EXPECT_EQ(std::memcmp(g.decode_scales, w.decode_scales, s.decode_scale_count * sizeof(float)), 0) << what;
      }
    }
    graphs_.release(&graph_ids_[l], 1, nullptr);
    eager_.release(&eager_ids_[l], 1, nullptr);
  }

  // One step: forward in the BF16 layout, backward in the GEMM layout, drain.
  void step(const std::vector<int>& layers) {
    for (int l : layers) use(l, Phase::kForward, Layout::kBF16);
    for (auto l = layers.rbegin(); l != layers.rend(); ++l) use(*l, Phase::kBackward, Layout::kGemm);
    graphs_.drain(nullptr);
    eager_.drain(nullptr);
  }

  Runtime& graphs() { return graphs_; }
  Runtime& eager() { return eager_; }
  GroupStats stats() const { return graphs_.group_stats(0); }

 private:
  static RuntimeConfig with_graphs(RuntimeConfig config) {
    config.cache.poison_released = true;
    return config;
  }
  static RuntimeConfig without_graphs(RuntimeConfig config) {
    config.fill_graphs = 0;
    for (GroupConfig& group : config.groups) group.fill_graphs = 0;
    return with_graphs(config);
  }

  comm::HostComm& comm_;
  HostBackend backend_;
  Runtime graphs_;
  Runtime eager_;
  std::vector<std::vector<float>> shards_;
  std::vector<WeightId> graph_ids_, eager_ids_;
};

TEST(FillGraphs, EachDistinctFillIsRecordedOnceAndLaterStepsOnlyLaunch) {
  for (const int ranks : {2, 4}) {
    for (const int batch : {1, 2}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", prefetch batch " + std::to_string(batch));
      on_ranks(ranks, [&](comm::HostComm& comm) {
        RuntimeConfig config;
        config.depth = 2;
        config.prefetch_batch = batch;
        config.fill_graphs = 256;
        Twins twins(comm, config, std::vector<std::int64_t>(6, 48));
        const std::vector<int> layers = {0, 1, 2, 3, 4, 5};
        std::int64_t recordings = 0, launches = 0;
        for (int step = 0; step < 6; ++step) {
          twins.update(step);
          twins.step(layers);
          const GroupStats s = twins.stats();
          if (step >= 3) {  // the schedule recorded, the slots settled: the same fills every step
            EXPECT_EQ(s.graph_recordings, recordings) << "a fill recorded again at step " << step;
            EXPECT_GT(s.graph_fills, launches) << "no fill launched at step " << step;
          }
          recordings = s.graph_recordings;
          launches = s.graph_fills;
        }
        const GroupStats s = twins.stats();
        EXPECT_GT(s.graph_recordings, 0);
        EXPECT_LE(s.fill_graphs, s.graph_recordings);  // less when a slot grew in the first step
        EXPECT_GT(s.graph_fills, 2 * s.graph_recordings) << "graphs were not reused";
        EXPECT_EQ(twins.graphs().stats().prefetch_hits, twins.eager().stats().prefetch_hits);
        EXPECT_EQ(twins.graphs().stats().exposed_gathers, twins.eager().stats().exposed_gathers);
      });
    }
  }
}

// A larger key grows the slots (their buffers move): every graph holding an old address is dropped
// and the fills into the moved slots are recorded anew.
TEST(FillGraphs, ASlotThatMovesDropsTheGraphsRecordedWithIt) {
  on_ranks(2, [](comm::HostComm& comm) {
    RuntimeConfig config;
    config.depth = 1;
    config.fill_graphs = 64;
    Twins twins(comm, config, {32, 32, 32, 32, 256});
    for (int step = 0; step < 3; ++step) {
      twins.update(step);
      twins.step({0, 1, 2, 3});
    }
    const GroupStats before = twins.stats();
    EXPECT_GT(before.fill_graphs, 0);
    twins.update(3);
    twins.step({0, 1, 2, 3, 4});  // layer 4 is 8x larger: slots grow
    const GroupStats after = twins.stats();
    EXPECT_GT(after.cache.slot_bytes, before.cache.slot_bytes);
    EXPECT_LT(after.fill_graphs, before.fill_graphs + after.graph_recordings - before.graph_recordings)
        << "graphs of moved slots were kept";
    for (int step = 4; step < 7; ++step) {
      twins.update(step);
      twins.step({0, 1, 2, 3, 4});
    }
  });
}

TEST(FillGraphs, FillsPastTheLimitRunEagerlyAndResetChainsDropsTheGraphs) {
  on_ranks(2, [](comm::HostComm& comm) {
    RuntimeConfig config;
    config.depth = 2;
    config.fill_graphs = 2;
    Twins twins(comm, config, std::vector<std::int64_t>(5, 48));
    for (int step = 0; step < 4; ++step) {
      twins.update(step);
      twins.step({0, 1, 2, 3, 4});
    }
    GroupStats s = twins.stats();
    EXPECT_EQ(s.fill_graphs, 2);
    EXPECT_GE(s.graph_recordings, 2);  // more when a slot grew in the first step
    EXPECT_GT(s.graph_fills, 2);
    EXPECT_LT(s.graph_fills, twins.graphs().stats().prefetches + twins.graphs().stats().exposed_gathers)
        << "every fill ran as a graph";
    twins.graphs().reset_chains();
    twins.eager().reset_chains();
    EXPECT_EQ(twins.stats().fill_graphs, 0);
    for (int step = 4; step < 6; ++step) {
      twins.update(step);
      twins.step({4, 3, 2, 1, 0});  // a rebuilt model: another order
    }
    EXPECT_EQ(twins.stats().fill_graphs, 2);
  });
}

TEST(FillGraphs, ANegativeLimitIsRefused) {
  on_ranks(1, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.fill_graphs = -1;
    try {
      Runtime runtime(backend, config);
      ADD_FAILURE() << "fill_graphs = -1 was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fill_graphs -1 is negative"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace gtp::remat

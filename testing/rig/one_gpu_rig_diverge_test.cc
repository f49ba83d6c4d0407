// Ranks that disagree (issue 21) between real CUDA peers, on ONE GPU through the one-GPU rig (a test
// double for NCCL, one_gpu_rig.h): G = 2 and 4 rig ranks run the real Runtime on CudaBackend and
// disagree, and every rank must get DivergenceError (not success, not a hang, not a crash) at its
// first call after the device ran the fill-tag check, naming the differing ranks exactly as the host
// backend's message does (the same script on G host ranks is the reference). Cases: a rank registers
// the two weights in the opposite order; a rank materializes another weight; a fill graph's replay
// re-checks (kernel or stream-memory-operation flags only: host-rendezvous collectives are not
// capturable); a pair of ranks that agree keeps working beside a pair that diverges; the control:
// ranks that agree match the host backend bit for bit. The diverging materialize's bytes must be the
// check's poison (0xFF over the gathered chunks: BF16 0xFFFF in place, NaN after an FP8 unpack), so a
// skipped check fails here twice: no error, and the gathered data instead of the poison.
// docs/reliability.md, "Ranks that disagree". Without a GPU each case still checks its host-backend
// reference (errors, calls and messages), then skips, printing why.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/host.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/divergence.h"
#include "remat/host_backend.h"
#include "testing/rig/rig_ranks.h"
#include "testing/rig/one_gpu_rig.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

constexpr std::int64_t kRows = 64, kCols = 64;  // 16 rows a rank at G = 4: full shards on both wires
constexpr int kWeights = 2;                     // "w0", "w1"

// Weight k's BF16 bits at (row, col): finite, positive, distinct per weight; never NaN (the poison).
std::uint16_t bits_of(int k, std::int64_t row, std::int64_t col) {
  return static_cast<std::uint16_t>(0x3C00 + k * 0x200 + (row * 7 + col * 3) % 0x200);
}
bool is_nan_bf16(std::uint16_t bits) { return (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0; }

// One rank's part of a scenario: the weights in its registration order, and the weight that each of
// its materialize calls names (materialize, read back, release, one step each).
struct RankScript {
  std::vector<int> order = {0, 1};
  std::vector<int> steps;
};

// G ranks per part, `parts` parts (communicators) of one backend group; scripts[part][group rank].
// diverge[part]: the step at which that part's ranks disagree, -1 where they agree throughout.
struct Scenario {
  int ranks = 2;
  int parts = 1;
  kernels::WireSpec wire{kernels::WireFormat::kBF16};
  std::int64_t fill_graphs = 0;
  std::vector<std::vector<RankScript>> scripts;
  std::vector<int> diverge;
};

// What one rank saw: each materialize's BF16 weight; the DivergenceError and the call that raised it;
// whether (rig only) the next call raised it again; fills run from a fill graph.
struct Seen {
  std::vector<std::vector<std::uint16_t>> weights;
  std::string error, error_call;
  bool spent = false;
  std::int64_t graph_fills = 0, graph_recordings = 0;
};

// One rank's script on either backend. With a `stage` (the rig): device memory, every copy on
// `stream` through the pinned stage, and the stream synchronized after each read-back, so the fill's
// check has run before the release; without: host memory. Only DivergenceError is caught: it ends the
// script, which every scenario ends with, so no rank issues a collective its peers do not.
Seen run_rank(Backend& backend, testing::PinnedStage* stage, cudaStream_t stream, int rank, const Scenario& s,
              const RankScript& script) {
  const bool device = stage != nullptr;
  const auto sync = [&] {
    if (device) stage->finish(stream);
  };
  RuntimeConfig config;
  config.depth = 0;  // no prefetch: each materialize is one on-demand fill, and a release issues nothing
  config.fill_graphs = s.fill_graphs;
  config.check_every_fill = true;  // each fill checked before it is unpacked: what these cases test
  Runtime runtime(backend, config);
  const auto geometry = kernels::weight_geometry(s.wire.format, kRows, kCols, s.ranks);
  const std::int64_t valid = geometry.valid_rows(rank), first = rank * geometry.shard_rows;
  const std::int64_t shard_bytes = std::max<std::int64_t>(valid, 1) * kCols * 2;
  std::vector<WeightId> id_of(kWeights, kNoWeight);
  std::vector<void*> shards;
  for (int k : script.order) {
    std::vector<std::uint16_t> host(static_cast<std::size_t>(valid * kCols));
    for (std::int64_t i = 0; i < valid * kCols; ++i) host[i] = bits_of(k, first + i / kCols, i % kCols);
    shards.push_back(backend.allocate(shard_bytes));
    if (device) {
      stage->upload(shards.back(), host.data(), valid * kCols * 2, stream);
    } else {
      std::memcpy(shards.back(), host.data(), static_cast<std::size_t>(valid * kCols * 2));
    }
    WeightDesc desc;
    desc.name = "w" + std::to_string(k);
    desc.shard = shards.back();
    desc.rows = kRows;
    desc.cols = kCols;
    desc.wire = s.wire;
    id_of[k] = runtime.register_weight(desc);
  }
  sync();
  runtime.shard_updated(id_of.data(), kWeights, stream);  // by name (w0, w1), whatever the ids
  Seen seen;
  const auto call = [&](const std::string& what, const auto& body) {
    try {
      body();
      return true;
    } catch (const DivergenceError& e) {
      seen.error = e.what();
      seen.error_call = what;
      return false;
    }
  };
  for (std::size_t step = 0; step < script.steps.size(); ++step) {
    const WeightId id = id_of[script.steps[step]];
    void* data = nullptr;
    if (!call("materialize " + std::to_string(step),
              [&] { data = runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, stream)[0]; })) {
      break;
    }
    seen.weights.emplace_back(static_cast<std::size_t>(kRows * kCols));
    if (device) {
      stage->download(seen.weights.back().data(), data, kRows * kCols * 2, stream);
    } else {
      std::memcpy(seen.weights.back().data(), data, static_cast<std::size_t>(kRows * kCols * 2));
    }
    sync();  // CUDA: the check kernel ran before this stream's wait; the next call reports its verdict
    if (!call("release " + std::to_string(step), [&] { runtime.release(&id, 1, stream); })) break;
  }
  // The runtime is spent: a later call reports the divergence again before it issues anything. (Not
  // on the host backend, where it would gather the tags once more.)
  if (device && !seen.error.empty()) {
    try {
      runtime.materialize(&id_of[0], 1, Phase::kForward, 0, Layout::kBF16, stream);
    } catch (const DivergenceError&) {
      seen.spent = true;
    }
  }
  sync();
  seen.graph_fills = runtime.group_stats(0).graph_fills;
  seen.graph_recordings = runtime.group_stats(0).graph_recordings;
  for (void* shard : shards) backend.deallocate(shard, shard_bytes);
  return seen;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return out + (ranks.size() == 1 ? " gathers" : " gather");
}

// The weight bytes an all-gather would leave without the check: group rank q's rows from the weight
// q names at `step` (BF16 wire: the gathered rows are the weight).
std::vector<std::uint16_t> unchecked_bf16(const Scenario& s, int part, int step) {
  const auto geometry = kernels::weight_geometry(s.wire.format, kRows, kCols, s.ranks);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(kRows * kCols));
  for (std::int64_t row = 0; row < kRows; ++row) {
    const int k = s.scripts[part][static_cast<std::size_t>(row / geometry.shard_rows)].steps[step];
    for (std::int64_t col = 0; col < kCols; ++col) out[row * kCols + col] = bits_of(k, row, col);
  }
  return out;
}

// Which ranks the message says gathered what, by group rank (the same text on every rank of a part).
void expect_names_the_ranks(const std::string& text, const Scenario& s, int part, int step) {
  std::vector<int> by_weight[kWeights], straight, swapped;
  for (int q = 0; q < s.ranks; ++q) {
    const RankScript& other = s.scripts[part][q];
    by_weight[other.steps[step]].push_back(q);
    (other.order[0] == 0 ? straight : swapped).push_back(q);
  }
  if (!swapped.empty()) {  // every rank names w0: registration #1 on the swapped ranks
    EXPECT_NE(text.find(ranks_text(straight) + " 'w0' (registration #0"), std::string::npos) << text;
    EXPECT_NE(text.find(ranks_text(swapped) + " 'w0' (registration #1"), std::string::npos) << text;
    return;
  }
  for (int k = 0; k < kWeights; ++k) {
    if (by_weight[k].empty()) continue;
    EXPECT_NE(text.find(ranks_text(by_weight[k]) + " 'w" + std::to_string(k) + "' (registration #" + std::to_string(k)),
              std::string::npos)
        << text;
  }
}

// The reference: the scenario on G host ranks per part. The host backend refuses the diverging fill
// itself, at its materialize, on every rank of the part.
std::vector<Seen> host_reference(const Scenario& s) {
  std::vector<Seen> host(s.ranks * s.parts);
  for (int part = 0; part < s.parts; ++part) {
    const auto timeout = std::chrono::milliseconds(60000);
    auto group = comm::ThreadBootstrap::create_group(s.ranks, timeout);
    comm::internal::rethrow_first(comm::internal::run_ranks(s.ranks, [&](int rank) {
      comm::HostComm comm(*group[rank], timeout);
      HostBackend backend({&comm});
      host[part * s.ranks + rank] = run_rank(backend, nullptr, nullptr, rank, s, s.scripts[part][rank]);
    }));
  }
  for (int r = 0; r < s.ranks * s.parts; ++r) {
    SCOPED_TRACE("host rank " + std::to_string(r));
    const int part = r / s.ranks, step = s.diverge[part];
    const Seen& h = host[r];
    const std::size_t agreed = step < 0 ? s.scripts[part][r % s.ranks].steps.size() : static_cast<std::size_t>(step);
    EXPECT_EQ(h.weights.size(), agreed) << h.error;
    for (const auto& weight : h.weights) {  // no NaN: the rig's poison below cannot be the data
      EXPECT_FALSE(std::any_of(weight.begin(), weight.end(), is_nan_bf16));
    }
    if (step < 0) {
      EXPECT_EQ(h.error, "");
      continue;
    }
    EXPECT_EQ(h.error_call, "materialize " + std::to_string(step)) << h.error;
    EXPECT_NE(h.error.find("diverged at a gather (on demand, this is rank " + std::to_string(r % s.ranks) + "): "),
              std::string::npos)
        << h.error;
    expect_names_the_ranks(h.error, s, part, step);
  }
  return host;
}

// Runs the scenario on the host backend (the reference, anywhere) and, with a GPU, on the rig, and
// compares every rank. False: no GPU, `why` says why.
bool compare(const Scenario& s, std::string* why) {
  SCOPED_TRACE("G=" + std::to_string(s.ranks) + " x " + std::to_string(s.parts) + " " + kernels::to_string(s.wire) +
               (s.fill_graphs > 0 ? " fill graphs" : " eager"));
  const std::vector<Seen> host = host_reference(s);
  if (!kernels::cuda_device_available(why)) return false;
  const int world = s.ranks * s.parts;
  std::vector<Seen> rig_seen(world);
  std::vector<std::vector<int>> parts(s.parts);
  for (int r = 0; r < world; ++r) parts[r / s.ranks].push_back(r);
  OneGpuRig rig(0, world, {parts}, testing::rig_flags_from_env());
  auto stages = testing::pinned_stages(world, std::int64_t{1} << 20);  // before any rank runs
  testing::on_rig_ranks(rig, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    {
      CudaBackend backend(0, rig.transport(rank));
      rig_seen[rank] = run_rank(backend, stages[rank].get(), stream, rank % s.ranks, s,
                                s.scripts[rank / s.ranks][rank % s.ranks]);
    }
    cudaStreamDestroy(stream);
  });
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rig rank " + std::to_string(r));
    const int part = r / s.ranks, step = s.diverge[part];
    const Seen &h = host[r], &g = rig_seen[r];
    // Every materialize the ranks agreed on: bit for bit the host backend's.
    const std::size_t agreed = h.weights.size();
    if (g.weights.size() < agreed) {
      ADD_FAILURE() << "the rig rank returned " << g.weights.size() << " of the " << agreed
                    << " materializes its group agreed on: " << g.error;
      continue;
    }
    for (std::size_t i = 0; i < agreed; ++i) {
      EXPECT_TRUE(g.weights[i] == h.weights[i]) << "materialize " << i << " differs from the host backend's";
    }
    if (s.fill_graphs > 0) {  // one slot, reused: each weight's fill recorded once, then launched
      EXPECT_EQ(g.graph_recordings, kWeights);
      EXPECT_EQ(g.graph_fills, static_cast<std::int64_t>(g.weights.size())) << "a fill ran eagerly";
    }
    if (step < 0) {
      EXPECT_EQ(g.weights.size(), agreed);
      EXPECT_EQ(g.error, "") << "a rank that agrees with its group failed";
      continue;
    }
    // The CUDA backend enqueues the diverging fill, poisons it on the device, and the next call (the
    // release) reports it.
    EXPECT_EQ(g.error_call, "release " + std::to_string(step)) << g.error;
    if (g.weights.size() != agreed + 1) {
      ADD_FAILURE() << "the rig rank did not return the diverging fill: " << g.error;
      continue;
    }
    const std::vector<std::uint16_t>& poisoned = g.weights.back();
    if (s.wire.format == kernels::WireFormat::kBF16) {
      const std::vector<std::uint16_t> unchecked = unchecked_bf16(s, part, step);
      EXPECT_FALSE(std::any_of(unchecked.begin(), unchecked.end(), is_nan_bf16));
      EXPECT_TRUE(std::all_of(poisoned.begin(), poisoned.end(), [](std::uint16_t b) { return b == 0xFFFF; }))
          << "the diverging fill's BF16 weight (gathered in place) is not 0xFF bytes"
          << (poisoned == unchecked ? ": it is what the all-gather gathered (was the check skipped?)" : "");
    } else {
      const auto clean = std::count_if(poisoned.begin(), poisoned.end(), [](std::uint16_t b) { return !is_nan_bf16(b); });
      EXPECT_EQ(clean, 0) << "elements of the diverging fill's FP8 weight are not NaN";
    }
    EXPECT_TRUE(g.spent) << "the call after the error did not raise it again";
    // The message: the host backend's, but for where it was found.
    const std::string found = "found on the device after the gather, reported at this rank's next call";
    EXPECT_NE(g.error.find("diverged at a gather (" + found + ", this is rank " + std::to_string(r % s.ranks) + "): "),
              std::string::npos)
        << g.error;
    const std::size_t hat = h.error.find(", this is rank "), gat = g.error.find(", this is rank ");
    EXPECT_TRUE(hat != std::string::npos && gat != std::string::npos &&
                g.error.substr(gat) == h.error.substr(hat))
        << "the rig rank's message differs from the host rank's past \"this is rank\":\n  rig:  " << g.error
        << "\n  host: " << h.error;
    expect_names_the_ranks(g.error, s, part, step);
  }
  return true;
}

const kernels::WireSpec kWires[] = {kernels::WireSpec{kernels::WireFormat::kBF16},
                                    kernels::WireSpec{kernels::WireFormat::kFP8}};

// Every rank of one part runs `steps`; rank `odd` runs `odd_steps` (and registers in `odd_order`).
std::vector<RankScript> part_of(int ranks, const std::vector<int>& steps, int odd = -1,
                                const std::vector<int>& odd_steps = {}, const std::vector<int>& odd_order = {0, 1}) {
  std::vector<RankScript> out(static_cast<std::size_t>(ranks), RankScript{{0, 1}, steps});
  if (odd >= 0) out[odd] = RankScript{odd_order, odd_steps};
  return out;
}

// Runs `s` on the rig and on the host backend and compares them; without a CUDA device the test
// skips (the host backend's reference was checked first).
void compare_or_skip(const Scenario& s) {
  std::string why;
  if (!compare(s, &why)) GTEST_SKIP() << "no CUDA device (the host backend's reference was checked): " << why;
}

// compare_or_skip for each wire of kWires.
void compare_each_wire(Scenario s) {
  for (const kernels::WireSpec& wire : kWires) {
    s.wire = wire;
    compare_or_skip(s);
    if (::testing::Test::IsSkipped()) return;
  }
}

class RigDiverge : public ::testing::TestWithParam<int> {};

// (a) Rank 1 registers w1 before w0, then every rank materializes w0: the first fill diverges.
TEST_P(RigDiverge, RegistrationInTheOppositeOrderFailsEveryRank) {
  Scenario s;
  s.ranks = GetParam();
  s.scripts = {part_of(s.ranks, {0}, 1, {0}, {1, 0})};
  s.diverge = {0};
  compare_each_wire(s);
}

// (b) Every rank materializes w0 (agreeing: the data is the host backend's), then rank 1 materializes
// w1 while the others materialize w0.
TEST_P(RigDiverge, AnotherWeightOnOneRankFailsEveryRank) {
  Scenario s;
  s.ranks = GetParam();
  s.scripts = {part_of(s.ranks, {0, 0}, 1, {0, 1})};
  s.diverge = {1};
  compare_each_wire(s);
}

// (d) The control: the same calls with every rank agreeing pass, bit-identical to the host backend.
TEST_P(RigDiverge, AgreeingRanksMatchTheHostBackend) {
  Scenario s;
  s.ranks = GetParam();
  s.scripts = {part_of(s.ranks, {0, 1, 0, 1})};
  s.diverge = {-1};
  compare_each_wire(s);
}

// Two parts of G ranks (two communicators of one backend group on one GPU): the first diverges as in
// (b), the second agrees and keeps working past that point, bit-identical to the host backend.
TEST_P(RigDiverge, AnAgreeingPartKeepsWorkingBesideADivergingOne) {
  Scenario s;
  s.ranks = GetParam();
  s.parts = 2;
  s.scripts = {part_of(s.ranks, {0, 0}, 1, {0, 1}), part_of(s.ranks, {0, 1, 0, 1, 0})};
  s.diverge = {1, -1};
  compare_or_skip(s);
}

// Fill graphs: w0 and w1 are recorded, w0 replayed, then rank 1 names w1 where the others replay w0's
// graph: the check recorded in the graph runs at each launch. Captured collectives: not with
// host-rendezvous flags.
TEST_P(RigDiverge, FillGraphLaunchesRecheck) {
  if (testing::rig_flags_from_env() == OneGpuRig::Flags::kHostRendezvous) {
    GTEST_SKIP() << "GTP_RIG_FLAGS=host: host-rendezvous collectives cannot be captured into fill graphs";
  }
  Scenario s;
  s.ranks = GetParam();
  s.fill_graphs = 64;
  s.scripts = {part_of(s.ranks, {0, 1, 0, 0}, 1, {0, 1, 0, 1})};
  s.diverge = {3};
  compare_each_wire(s);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RigDiverge, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "G" + std::to_string(info.param); });

}  // namespace
}  // namespace gtp::remat

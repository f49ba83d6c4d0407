// Host time per runtime call at G = 1, 2, 4 on ONE GPU through the one-GPU rig (a TEST DOUBLE for
// NCCL, remat/one_gpu_rig.h): the P6 host-overhead target of issue 21 at G > 1, where every fill also
// writes its 64-byte tag, gathers the G tags in its collective batch and enqueues the check kernel
// (docs/reliability.md, "Ranks that disagree"; at G = 1 the runtime skips all three). Each rank is a
// thread with its own CudaBackend(device, rig.transport(rank)) and Runtime (depth 0: every materialize
// is one on-demand fill), and times, per call, on the host:
//   eager        materialize + release of `weights` tiny weights in one call: one fill (BF16, FP8;
//                1 and 8 weights a call);
//   fill_graph   the same with fill graphs on (RuntimeConfig::fill_graphs), after warm-up recorded
//                every fill's graph: each timed fill is a graph launch;
//   rig_gather   one 64-byte all-gather through the rig alone (Backend::all_gather outside a batch):
//                what the test transport itself costs per collective, to read the rows above with.
// A step is 8 such calls, then drain and a synchronization of the rank's stream (not timed); medians
// per rank over every timed call, printed as the median over ranks (and the slowest rank).
// What it measures: libgtp's host cost (tag write, tag gather issue, check kernel, graph launch) at
// G > 1 on a test transport, NOT NCCL's: the rig issues each collective as its own flag and copy
// kernels where NCCL would launch one kernel per group, and the ranks are threads of one process
// sharing one CUDA context, so they also contend for the driver, which separate processes would not.
//
// A rig wait that a peer never joins traps after the rig's spin timeout (30 s, kernel flags): that
// configuration is reported as failed and, the CUDA context being lost, the later ones as not run;
// the JSON is rewritten after every configuration, so the rig's watchdog (GTP_RIG_WATCHDOG_S) ending
// the process still leaves what was measured. Eager configurations run first.
// Without a CUDA device it says so and exits 0.
//   bazel run -c opt //bench/remat:fill_tag_rig_bench -- [--ranks 1,2,4] [--steps 200] [--warmup 5]
//     [--rig-flags kernels|memops|auto] [--cases eager,fill_graph,rig_gather] [--json PATH]
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/internal/rig_ranks.h"
#include "remat/one_gpu_rig.h"
#include "remat/runtime.h"

namespace {

using gtp::remat::CudaBackend;
using gtp::remat::OneGpuRig;
using json = nlohmann::json;

constexpr std::int64_t kRows = 64, kCols = 64;  // tiny weights: host cost dominates
constexpr int kCallsPerStep = 8;

struct Config {
  std::string kind;  // "eager", "fill_graph", "rig_gather"
  gtp::kernels::WireFormat wire = gtp::kernels::WireFormat::kBF16;
  int weights = 1;  // per call
  int ranks = 1;
};

std::string describe(const Config& c) {
  if (c.kind == "rig_gather") return "rig_gather 64 B";
  return c.kind + " " + gtp::kernels::to_string(c.wire) + " x" + std::to_string(c.weights);
}

struct RankResult {
  double median_us = 0, p90_us = 0;
  std::int64_t calls = 0;
  // Over the timed steps: fills per call run eagerly / from a graph, and graphs recorded meanwhile.
  double eager_fills_per_call = 0, graph_fills_per_call = 0;
  std::int64_t recordings_while_timed = 0;
};

// Nearest rank; the median of an even count is the mean of the two middle values.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  if (q == 0.5 && v.size() % 2 == 0) return (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

void must(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// One rank's run of `c`: warm-up steps, then timed ones.
RankResult run_rank(CudaBackend& backend, cudaStream_t stream, const Config& c, int warmup, int steps) {
  using clock = std::chrono::steady_clock;
  std::vector<double> times;
  RankResult out;
  if (c.kind == "rig_gather") {
    const gtp::remat::Stream gather = backend.side_stream(0, gtp::remat::Role::kGather);  // the rig's one stream
    void* send = backend.allocate(64);
    void* recv = backend.allocate(64 * backend.group_size(0));
    backend.fill(gather, send, 0, 64);
    for (int s = 0; s < warmup + steps; ++s) {
      for (int i = 0; i < kCallsPerStep; ++i) {
        const auto start = clock::now();
        backend.all_gather(gather, 0, send, recv, 64);
        if (s >= warmup) times.push_back(std::chrono::duration<double, std::micro>(clock::now() - start).count());
      }
      must(cudaStreamSynchronize(static_cast<cudaStream_t>(gather)), "cudaStreamSynchronize");
    }
    backend.deallocate(send, 64);
    backend.deallocate(recv, 64 * backend.group_size(0));
  } else {
    gtp::remat::RuntimeConfig config;
    config.depth = 0;
    config.fill_graphs = c.kind == "fill_graph" ? 1024 : 0;
    config.check_every_fill = true;  // the per-fill check is what this measures
    gtp::remat::Runtime runtime(backend, config);
    const auto geometry = gtp::kernels::weight_geometry(c.wire, kRows, kCols, backend.group_size(0));
    const std::int64_t shard_bytes = std::max<std::int64_t>(geometry.valid_rows(backend.group_rank(0)), 1) * kCols * 2;
    std::vector<void*> shards;
    std::vector<gtp::remat::WeightId> ids;
    for (int i = 0; i < kCallsPerStep * c.weights; ++i) {
      shards.push_back(backend.allocate(shard_bytes));
      backend.fill(stream, shards.back(), 0x3C, shard_bytes);  // BF16 0x3C3C, about 0.0115
      gtp::remat::WeightDesc desc;
      desc.name = "w" + std::to_string(i);
      desc.shard = shards.back();
      desc.rows = kRows;
      desc.cols = kCols;
      desc.wire = gtp::kernels::WireSpec{c.wire};
      ids.push_back(runtime.register_weight(desc));
    }
    runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
    gtp::remat::GroupStats before;
    std::int64_t exposed_before = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        before = runtime.group_stats(0);
        exposed_before = runtime.stats().exposed_gathers;
      }
      for (int i = 0; i < kCallsPerStep; ++i) {
        const gtp::remat::WeightId* ws = ids.data() + static_cast<std::size_t>(i) * c.weights;
        const auto start = clock::now();
        runtime.materialize(ws, c.weights, gtp::remat::Phase::kForward, 0, gtp::remat::Layout::kBF16, stream);
        runtime.release(ws, c.weights, stream);
        if (s >= warmup) times.push_back(std::chrono::duration<double, std::micro>(clock::now() - start).count());
      }
      runtime.drain(stream);
      must(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    const gtp::remat::GroupStats after = runtime.group_stats(0);
    const double calls = static_cast<double>(times.size());
    const double fills = static_cast<double>(runtime.stats().exposed_gathers - exposed_before);
    out.graph_fills_per_call = static_cast<double>(after.graph_fills - before.graph_fills) / calls;
    out.eager_fills_per_call = fills / calls - out.graph_fills_per_call;
    out.recordings_while_timed = after.graph_recordings - before.graph_recordings;
    for (void* shard : shards) backend.deallocate(shard, shard_bytes);
  }
  out.calls = static_cast<std::int64_t>(times.size());
  out.median_us = quantile(times, 0.5);
  out.p90_us = quantile(times, 0.9);
  return out;
}

struct Options {
  std::vector<int> ranks = {1, 2, 4};
  std::vector<std::string> cases = {"eager", "fill_graph", "rig_gather"};
  int steps = 200, warmup = 5;
  OneGpuRig::Flags flags = OneGpuRig::Flags::kKernels;
  std::string json_path;
  bool help = false;
};

const char* const kUsage =
    "usage: fill_tag_rig_bench [--ranks 1,2,4] [--cases eager,fill_graph,rig_gather] [--steps 200] [--warmup 5]\n"
    "                          [--rig-flags kernels|memops|auto] [--json PATH]\n";

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) out.push_back(part);
  return out;
}

int whole(const std::string& flag, const std::string& v, int low, int high) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos || std::stoi(v) < low ||
      std::stoi(v) > high) {
    throw std::invalid_argument(flag + " '" + v + "' is not a whole number in " + std::to_string(low) + ".." +
                                std::to_string(high));
  }
  return std::stoi(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (or is not a flag)");
    const std::string v = argv[++i];
    if (flag == "--ranks") {
      o.ranks.clear();
      for (const std::string& g : split(v)) o.ranks.push_back(whole("--ranks", g, 1, 8));
    } else if (flag == "--cases") {
      o.cases = split(v);
      for (const std::string& c : o.cases) {
        if (c != "eager" && c != "fill_graph" && c != "rig_gather") {
          throw std::invalid_argument("--cases '" + c + "' is not eager, fill_graph or rig_gather");
        }
      }
    } else if (flag == "--steps") {
      o.steps = whole(flag, v, 1, 100000);
    } else if (flag == "--warmup") {
      o.warmup = whole(flag, v, 2, 1000);  // the first step records the fill graphs
    } else if (flag == "--rig-flags") {
      if (v == "kernels") {
        o.flags = OneGpuRig::Flags::kKernels;
      } else if (v == "memops") {
        o.flags = OneGpuRig::Flags::kStreamMemOps;
      } else if (v == "auto") {
        o.flags = OneGpuRig::Flags::kAuto;
      } else {  // host rendezvous: the host waits for every peer at each collective, and no graphs
        throw std::invalid_argument("--rig-flags '" + v + "' is not kernels, memops or auto");
      }
    } else if (flag == "--json") {
      o.json_path = v;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  return o;
}

const char* const kWhat =
    "libgtp's host cost per call at G > 1 (tag write, tag gather issue, check kernel, graph launch) on the one-GPU "
    "rig, a test transport (remat/one_gpu_rig.h), not NCCL's: the rig issues each collective as its own flag and "
    "copy kernels, and its ranks are threads of one process sharing one CUDA context (driver contention between "
    "them is included). At G = 1 the runtime skips the fill-tag check.";

void write_json(const Options& o, const json& doc) {
  if (o.json_path.empty()) return;
  std::ofstream file(o.json_path);
  file << doc.dump(2) << "\n";
  if (!file) std::fprintf(stderr, "fill_tag_rig_bench: could not write %s\n", o.json_path.c_str());
}

int run(const Options& o, const std::string& command) {
  cudaDeviceProp prop{};
  must(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime_version = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime_version);
  char hostname[256] = {0};
  gethostname(hostname, sizeof hostname - 1);
  const char* commit = std::getenv("GTP_COMMIT");
  json doc = {{"tool", "fill_tag_rig_bench"},
              {"machine",
               {{"hostname", hostname},
                {"gpu", prop.name},
                {"cpus", std::thread::hardware_concurrency()},
                {"cuda_driver", driver},
                {"cuda_runtime", runtime_version}}},
              {"commit", commit ? commit : "unknown"},
              {"command", command},
              {"transport", "one-GPU rig (a test double for NCCL)"},
              {"measures", kWhat},
              {"weight", {{"rows", kRows}, {"cols", kCols}}},
              {"steps", {{"warmup", o.warmup}, {"timed", o.steps}, {"calls_per_step", kCallsPerStep}}},
              {"results", json::array()}};
  std::printf("fill_tag_rig_bench on %s: %s\n", prop.name, kWhat);
  std::vector<Config> configs;
  using gtp::kernels::WireFormat;
  for (const std::string& kind : {std::string("rig_gather"), std::string("eager"), std::string("fill_graph")}) {
    if (std::find(o.cases.begin(), o.cases.end(), kind) == o.cases.end()) continue;
    for (int g : o.ranks) {
      if (kind == "rig_gather") {
        configs.push_back({kind, WireFormat::kBF16, 1, g});
        continue;
      }
      for (int weights : {1, 8})
        for (WireFormat wire : {WireFormat::kBF16, WireFormat::kFP8}) configs.push_back({kind, wire, weights, g});
    }
  }
  std::string lost;  // set once a configuration left the CUDA context unusable
  bool failed = false;
  std::vector<std::pair<Config, double>> medians;
  for (const Config& c : configs) {
    json result = {{"case", c.kind}, {"G", c.ranks}};
    if (c.kind != "rig_gather") {
      result["wire"] = gtp::kernels::to_string(c.wire);
      result["weights_per_call"] = c.weights;
    }
    if (!lost.empty()) {
      result["error"] = "not run: " + lost;
      doc["results"].push_back(result);
      std::printf("%-22s G=%d  not run (%s)\n", describe(c).c_str(), c.ranks, lost.c_str());
      continue;
    }
    std::vector<RankResult> per_rank(c.ranks);
    try {
      OneGpuRig rig(0, c.ranks, {}, o.flags, std::chrono::seconds(30), std::int64_t{64} << 20);
      doc["rig_flags"] = rig.flags();
      gtp::remat::testing::on_rig_ranks(rig, [&](int rank) {
        must(cudaSetDevice(0), "cudaSetDevice");
        cudaStream_t stream = nullptr;
        must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
        try {
          CudaBackend backend(0, rig.transport(rank));
          per_rank[rank] = run_rank(backend, stream, c, o.warmup, o.steps);
        } catch (...) {
          cudaStreamDestroy(stream);
          throw;
        }
        cudaStreamDestroy(stream);
      });
    } catch (const std::exception& e) {
      failed = true;
      result["error"] = e.what();
      const cudaError_t sticky = cudaDeviceSynchronize();  // every rank thread has ended
      if (sticky != cudaSuccess) {
        lost = "the CUDA context was lost at " + describe(c) + " G=" + std::to_string(c.ranks) + " (" +
               cudaGetErrorString(sticky) + ")";
      }
      doc["results"].push_back(result);
      write_json(o, doc);
      std::printf("%-22s G=%d  FAILED: %s\n", describe(c).c_str(), c.ranks, e.what());
      continue;
    }
    std::vector<double> medians_of_ranks;
    json ranks = json::array();
    for (const RankResult& r : per_rank) {
      medians_of_ranks.push_back(r.median_us);
      json one = {{"median_us", r.median_us}, {"p90_us", r.p90_us}, {"calls", r.calls}};
      if (c.kind != "rig_gather") {
        one["eager_fills_per_call"] = r.eager_fills_per_call;
        one["graph_fills_per_call"] = r.graph_fills_per_call;
        one["recordings_while_timed"] = r.recordings_while_timed;
      }
      ranks.push_back(one);
    }
    const double median = quantile(medians_of_ranks, 0.5);
    const double slowest = *std::max_element(medians_of_ranks.begin(), medians_of_ranks.end());
    result["host_us_per_call"] = {{"median_over_ranks", median}, {"slowest_rank", slowest}};
    result["ranks"] = ranks;
    // A fill-graph row is only that if every timed fill was a launch of a graph recorded in warm-up.
    std::string note;
    for (const RankResult& r : per_rank) {
      if (c.kind == "fill_graph" && (r.recordings_while_timed != 0 || r.eager_fills_per_call != 0)) {
        note = "  (NOT all graph launches: " + std::to_string(r.recordings_while_timed) + " recordings, " +
               std::to_string(r.eager_fills_per_call) + " eager fills per call)";
      }
      if (c.kind == "eager" && r.eager_fills_per_call != 1) note = "  (not one fill per call)";
    }
    if (!note.empty()) result["note"] = note.substr(2);
    doc["results"].push_back(result);
    write_json(o, doc);
    medians.emplace_back(c, median);
    std::printf("%-22s G=%d  %8.2f us per call (median over ranks; slowest rank %.2f)%s\n", describe(c).c_str(),
                c.ranks, median, slowest, note.c_str());
    std::fflush(stdout);
  }
  // The table: one row per case, one column per G.
  std::printf("\nhost us per call, median over ranks of each rank's median (%s):\n%-22s", doc.value("rig_flags", "").c_str(),
              "case");
  for (int g : o.ranks) std::printf("  %8s", ("G=" + std::to_string(g)).c_str());
  std::printf("\n");
  std::vector<std::string> rows;
  for (const Config& c : configs) {
    if (std::find(rows.begin(), rows.end(), describe(c)) == rows.end()) rows.push_back(describe(c));
  }
  for (const std::string& row : rows) {
    std::printf("%-22s", row.c_str());
    for (int g : o.ranks) {
      const auto found = std::find_if(medians.begin(), medians.end(), [&](const auto& m) {
        return describe(m.first) == row && m.first.ranks == g;
      });
      if (found == medians.end()) {
        std::printf("  %8s", "-");
      } else {
        std::printf("  %8.2f", found->second);
      }
    }
    std::printf("\n");
  }
  if (!o.json_path.empty()) std::printf("wrote %s\n", o.json_path.c_str());
  return failed ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fill_tag_rig_bench: %s\n%s", e.what(), kUsage);
    return 1;
  }
  if (o.help) {
    std::printf("%s%s\n", kUsage, kWhat);
    return 0;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) {
    std::printf("fill_tag_rig_bench: no CUDA device (%s); nothing measured\n", why.c_str());
    const char* commit = std::getenv("GTP_COMMIT");
    write_json(o, {{"tool", "fill_tag_rig_bench"}, {"commit", commit ? commit : "unknown"}, {"command", command},
                   {"skipped", "no CUDA device: " + why}});
    return 0;
  }
  try {
    return run(o, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fill_tag_rig_bench: %s\n", e.what());
    return 3;
  }
}

// One rank's run of the runtime's multi-rank scenario, on any backend: three layers (one so small that
// ranks hold only padding rows), several steps of forward and backward materializes with wgrads
// written or added into grad buffers and finalized, re-packs in varying orders, optionally
// keep_gathered, fill graphs, two groups, a step captured into a CUDA graph and replayed. Every rank
// records what it materialized and its main grads, so a device run (real NCCL peers) is compared bit
// for bit with the host backend's run of the same case. Test code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/arguments.h"
#include "remat/backend.h"
#include "remat/grads.h"

namespace gtp::remat::testing {

struct ScenarioShape {
  std::int64_t rows, cols;
};
// Shards are at least 16 rows on every wire: layer 1 (5 rows) leaves rank 0 a partial shard and every
// other rank only padding; layer 0 (40 rows) is partial on some rank at every G.
const std::vector<ScenarioShape>& scenario_shapes();

struct ScenarioCase {
  int ranks = 2;
  kernels::WireSpec wire{kernels::WireFormat::kBF16};
  int depth = 1;
  bool keep_gathered = false;
  std::int64_t fill_graphs = 0;
  GradInit grad_init = GradInit::kZero;
  bool accumulate = true;
  bool capture = false;        // device only: step kCapturedStep is captured, later ones replay it
  bool gemm_backward = false;  // the backward materializes the GEMM-ready layout (quantized wires)
  bool two_groups = false;     // layer 2 in a second backend group over the same ranks (an expert group)
  int microbatches = 2;
  int steps = 5;
};
inline constexpr int kCapturedStep = 2;

std::string describe(const ScenarioCase& c);

// The cases every multi-rank device test runs at G ranks (each list one test):
// every wire, zeroed (pooled) grads accumulated over microbatches, the backward in the GEMM-ready
// layout; layer 1 leaves rank 0 a partial shard and the last rank only padding rows;
std::vector<ScenarioCase> every_wire_cases(int ranks);
// undefined grad buffers written by the consumer, reduced every microbatch, depth 2, the last layer in
// one group with the others or in a second group (its own side streams and communicators);
std::vector<ScenarioCase> undefined_grad_cases(int ranks);
// keep_gathered (NVFP4 1D);
std::vector<ScenarioCase> keep_gathered_cases(int ranks);
// fill graphs (BF16, MXFP8);
std::vector<ScenarioCase> fill_graph_cases(int ranks);
// a step captured into a CUDA graph (collectives included) and replayed, with and without fill
// graphs, zeroed and undefined grads.
std::vector<ScenarioCase> captured_step_cases(int ranks);

// What one rank saw: every materialized weight (BF16 bytes, or every GEMM-ready section, in call
// order) and its main grads after every step (its valid rows).
struct Seen {
  std::vector<std::vector<unsigned char>> weights;
  std::vector<std::vector<float>> main_grads;
};

// How a device run moves the test's data, all ordered on `stream` (the consumer stream): uploads from
// host memory, downloads that land in host memory at sync(), and sync() waiting for `stream` only
// (never the device: a peer may be waiting for this rank).
struct ScenarioDevice {
  cudaStream_t stream = nullptr;
  std::function<void(void* dst, const void* src, std::int64_t bytes)> upload;
  std::function<void(void* dst, const void* src, std::int64_t bytes)> download;
  std::function<void()> sync;
};

// Runs case `c` as rank `rank` on `backend`: host memory when `device` is null, else device memory
// moved by `device`. Checks (gtest) that no chain mismatched and that the case's feature ran.
Seen run_scenario_rank(Backend& backend, const ScenarioDevice* device, int rank, const ScenarioCase& c);

// gtest assertions that `device` equals `host` bit for bit (every materialize, every main grad) and
// on rank 0 that the reference main grads are not all zero; `what` names the device side in messages.
void expect_same_as_host(const ScenarioCase& c, int rank, const Seen& device, const Seen& host, const std::string& what);

}  // namespace gtp::remat::testing

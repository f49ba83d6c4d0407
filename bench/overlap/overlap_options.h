// gtp-overlap-bench's host-side half: flags, the chain's shapes, the sizing arithmetic that makes one
// gather about as long as one GEMM, and the profile that carries the side streams' priority. No CUDA
// here, so all of it is tested on the CPU (overlap_options_test).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/wire_format.h"

namespace gtp::bench::overlap {

enum class Bootstrap { kCallbacks, kUcxFromEnv };

// The gtp_remat group's on/off settings in the generated profile.
struct GroupSwitches {
  bool keep_gathered = false;        // the backward (and later microbatches) read the forward's slot
  bool grads_into_main_grad = true;  // G = 1: the wgrad GEMM adds into the main grad, no reduce-scatter
};

struct Options {
  std::int64_t m = 0;  // activation rows (tokens); 0 = auto-size
  std::int64_t n = 8192;
  std::int64_t k = 8192;
  int layers = 8;
  int microbatches = 1;  // > 1: wgrads accumulate over the step, one reduce-scatter per weight per step
  int iters = 20;
  int warmup = 5;
  std::vector<kernels::WireFormat> wires = {kernels::WireFormat::kBF16, kernels::WireFormat::kFP8,
                                            kernels::WireFormat::kMXFP8, kernels::WireFormat::kNVFP4};
  std::vector<int> depths = {1, 2};                          // depth 0 (the all-exposed reference) is always added
  std::vector<std::string> priorities = {"high", "normal"};  // profile groups.gtp_remat.stream_priority
  GroupSwitches switches;      // profile groups.gtp_remat switches (--keep-gathered, --grads-into-main-grad)
  bool repack = false;         // re-pack every weight between steps (untimed), as after an optimizer step
  Bootstrap bootstrap = Bootstrap::kCallbacks;               // kCallbacks: one rank in this process
  double gather_gbps = 0;  // all-gather busbw for auto-sizing when G > 1 (GB/s); 0 = 360, NCCL's ring on H200
  std::int64_t timeout_ms = 120000;
  std::string json_path;
  bool help = false;
};

// Parses argv[1..argc). Throws std::invalid_argument naming the flag, the bad value and the fix.
Options parse_options(int argc, const char* const* argv);
std::string usage();

// Layer i's weight is [out_features, in_features]: [N, K] for even i and [K, N] for odd i, like an
// MLP's fc1 / fc2, so the chain composes for any N and K while every weight holds N x K elements
// and every GEMM does 2 M N K flops.
struct LayerShape {
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;
};
LayerShape layer_shape(const Options& options, int layer);

// The gather of one weight of `elements` elements with an unpack, as the runtime does it for a
// quantized wire: an all-gather of the wire chunks (modeled at BF16 size, the upper bound), then the
// unpack into the BF16 output. On one rank the all-gather is a device copy through a size-1
// communicator, so both passes move the bytes at the copy rate. The BF16 wire is gathered in place
// (no unpack pass), so for it this is twice the copy on one rank: the sizing keeps every wire's
// gather within the GEMM, and each configuration records the measured gather next to the GEMM.
//   copy_bytes_per_s: bytes copied per second by a device-to-device copy (measured)
//   busbw_bytes_per_s: the all-gather's bus bandwidth (nccl-tests' definition) when G > 1
double gather_seconds(std::int64_t elements, int group_size, double copy_bytes_per_s, double busbw_bytes_per_s);

// One step of the fixed point M = gather_seconds * rate(M) / (2 N K): the GEMM rate depends on M.
struct SizingStep {
  std::int64_t m = 0;
  double flops_per_s = 0;
  double gemm_seconds = 0;
};
struct Sizing {
  std::int64_t m = 0;
  double gather_seconds = 0;
  std::vector<SizingStep> steps;  // every M tried, with its measured rate
  std::string why;                // one line for the log and the JSON
};
// Chooses M (a multiple of 64 in [64, m_max]) so that a GEMM of 2 M N K flops at rate(M) lasts
// about gather_s. rate(M) returns flop/s (measured on the GPU by the benchmark). Stops when M
// repeats or after 8 steps, keeping the last M whose GEMM is at least as long as the gather.
Sizing choose_m(std::int64_t n, std::int64_t k, double gather_s, std::int64_t m_max,
                const std::function<double(std::int64_t)>& rate);

// A profile for `world_size` ranks on one host (TP 1, G = world size) whose gtp_remat group has
// the given stream priority, prefetch depth, wire format and switches. Throws std::invalid_argument
// for an unknown priority.
std::string profile_json(int world_size, const std::string& stream_priority, int prefetch_depth,
                         kernels::WireFormat wire, GroupSwitches switches = {});

}  // namespace gtp::bench::overlap

// gtp-bench all_gather | reduce_scatter, reporting nccl-tests' columns and busbw definitions
// (size = total bytes S, algbw = S / time, busbw = algbw * (n-1)/n). This file: options, the sweep,
// input data and checks shared by both paths, and the host-transport path; nccl_bench.h: the GPU path.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/bootstrap.h"
#include "comm/host.h"

namespace gtp::bench {

enum class Collective { kAllGather, kReduceScatter };
enum class BenchPath { kAuto, kHost, kGpu };  // auto: GPU when a CUDA device is present

struct BenchOptions {
  Collective collective = Collective::kAllGather;
  std::size_t min_bytes = 32 << 20;  // -b, total size S
  std::size_t max_bytes = 32 << 20;  // -e
  std::size_t factor = 2;            // -f, multiplicative step
  int iters = 20;                    // -n
  int warmup = 5;                    // -w
  bool check = true;                 // -c
  comm::HostDataType type = comm::HostDataType::kFloat32;  // -d float | bfloat16
  comm::HostReduceOp op = comm::HostReduceOp::kSum;        // -o sum | mean (reduce_scatter)
  std::string json_path;                                   // --json
  BenchPath path = BenchPath::kAuto;                       // --path auto | host | gpu
};

// Parses `COLLECTIVE [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [-c 0|1] [-d TYPE] [-o OP] [--json PATH]
// [--path auto|host|gpu]`
// (sizes accept K, M, G suffixes, powers of 1024). Throws std::invalid_argument with the usage.
BenchOptions parse_bench_args(const std::vector<std::string>& args);

// Parses "4096", "64K", "16M", "1G".
std::size_t parse_size(const std::string& text);

// nccl-tests' busbw factor for all-gather and reduce-scatter: (n-1)/n.
double bus_bandwidth_factor(int ranks);

// One size of the sweep: S rounded down so every rank gets the same whole number of elements.
struct SweepPoint {
  std::size_t size;  // S, total bytes (gathered output, or reduce-scatter input)
  std::size_t count;
  std::size_t per_rank_count;
};
std::vector<SweepPoint> sweep(const BenchOptions& options, int ranks);
std::size_t type_size(comm::HostDataType type);

// This rank's input for `point` (its shard for all-gather, its full input for reduce-scatter):
// deterministic, so every rank can recompute every other rank's data for the check.
std::vector<unsigned char> make_input(const BenchOptions& options, const SweepPoint& point, int rank);

// Wrong elements of this rank's output. `epsilon` is the relative rounding error of one addition in
// the reducer's accumulation type (2^-23 for FP32, 2^-8 for BF16).
long long count_wrong(const std::vector<unsigned char>& output, const BenchOptions& options, const SweepPoint& point,
                      int rank, int ranks, double epsilon);

struct BenchRow {
  std::size_t size;
  std::size_t count;
  std::string type;
  std::string redop;
  double time_us;  // mean over ranks of the mean iteration time
  double algbw;    // GB/s, 1e9 bytes
  double busbw;
  long long wrong;   // wrong elements over all ranks in the checked iteration; -1 without -c
  std::string path;  // "host", "nccl" (raw NCCL on a plain stream) or "gtp_stream" (see nccl_bench.h)
};

// Collective over `bootstrap`: averages the time over ranks and sums the wrong counts.
BenchRow summarize(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point, double mean_us,
                   long long wrong, const std::string& path);

// The host-transport path: every rank takes part, every rank gets the same rows.
std::vector<BenchRow> run_host_bench(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options);

std::string format_header(const BenchOptions& options, int ranks, const std::string& transport);
std::string format_row(const BenchRow& row);
nlohmann::json to_json(const BenchOptions& options, int ranks, const std::vector<BenchRow>& rows,
                       const std::string& command, const std::string& transport);

}  // namespace gtp::bench

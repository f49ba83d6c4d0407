// gtp-bench all_gather | reduce_scatter on the host transport, reporting nccl-tests' columns and
// busbw definitions (size = total bytes S, algbw = S / time, busbw = algbw * (n-1)/n).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/bootstrap.h"
#include "comm/host.h"

namespace gtp::bench {

enum class Collective { kAllGather, kReduceScatter };

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
};

// Parses `COLLECTIVE [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [-c 0|1] [-d TYPE] [-o OP] [--json PATH]`
// (sizes accept K, M, G suffixes, powers of 1024). Throws std::invalid_argument with the usage.
BenchOptions parse_bench_args(const std::vector<std::string>& args);

// Parses "4096", "64K", "16M", "1G".
std::size_t parse_size(const std::string& text);

// nccl-tests' busbw factor for all-gather and reduce-scatter: (n-1)/n.
double bus_bandwidth_factor(int ranks);

struct BenchRow {
  std::size_t size;   // S, total bytes (gathered output, or reduce-scatter input)
  std::size_t count;  // S / sizeof(type)
  std::string type;
  std::string redop;
  double time_us;  // mean over ranks of the mean iteration time
  double algbw;    // GB/s, 1e9 bytes
  double busbw;
  long long wrong;  // wrong elements over all ranks in the checked iteration; -1 without -c
};

// Runs the sweep; every rank takes part, every rank gets the same rows.
std::vector<BenchRow> run_bench(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options);

std::string format_header(const BenchOptions& options, int ranks);
std::string format_row(const BenchRow& row);
nlohmann::json to_json(const BenchOptions& options, int ranks, const std::vector<BenchRow>& rows,
                       const std::string& command);

}  // namespace gtp::bench

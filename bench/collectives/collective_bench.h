// gtp-bench all_gather | reduce_scatter, reporting nccl-tests' columns and busbw definitions
// (size = total bytes S, algbw = S / time, busbw = algbw * (n-1)/n). This file: options, the sweep,
// input data and checks shared by both paths, and the host-transport path; nccl_bench.h: the GPU path.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/bootstrap.h"
#include "comm/host.h"
#include "kernels/wire_format.h"

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
  std::string profile_path;                                // --profile FILE: the grid's parallel sizes
  std::string group = "world";                             // --group: a group family or dims (needs --profile)
  // --format (all_gather only): the payload is a BF16 weight [rows, kWireCols] gathered as this wire.
  std::optional<kernels::WireFormat> format;
};

// Columns of the weight a --format sweep gathers: every size S is a BF16 weight [rows, kWireCols].
inline constexpr std::size_t kWireCols = 4096;

// Parses `COLLECTIVE [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [-c 0|1] [-d TYPE] [-o OP] [--json PATH]
// [--path auto|host|gpu] [--profile FILE] [--group NAME] [--format bf16|fp8|mxfp8|nvfp4]`
// (sizes accept K, M, G suffixes, powers of 1024). Throws std::invalid_argument naming the flag, with
// the usage.
BenchOptions parse_bench_args(const std::vector<std::string>& args);

// The largest -b / -e: 1 TiB.
inline constexpr std::size_t kMaxBytes = std::size_t{1} << 40;

// Parses "4096", "64K", "16M", "1G": whole bytes in [1, kMaxBytes]; throws std::invalid_argument.
std::size_t parse_size(const std::string& text);

// nccl-tests' busbw factor for all-gather and reduce-scatter: (n-1)/n.
double bus_bandwidth_factor(int ranks);

// One size of the sweep: S rounded down so every rank gets the same whole number of elements. With
// --format, S is rounded down to a BF16 weight of kWireCols columns whose shards have a multiple of 32
// rows (MXFP8's alignment, so every format gathers the same weight), at least 32 rows per rank.
struct SweepPoint {
  std::size_t size;  // S, total bytes (gathered output, or reduce-scatter input)
  std::size_t count;
  std::size_t per_rank_count;
};
std::vector<SweepPoint> sweep(const BenchOptions& options, int ranks);

// Host memory one rank's sweep needs at its largest size: its input and output (and for --format the
// BF16 reference the check decodes against, and its wire chunks).
std::size_t host_bytes_per_rank(const BenchOptions& options, int ranks);
// Throws std::invalid_argument naming -e and the sizes when one rank needs more than `available`
// bytes: checked up front, instead of std::bad_alloc (or the OOM killer) mid-sweep.
void check_host_memory(const BenchOptions& options, int ranks, std::size_t available);
// MemAvailable of /proc/meminfo (else free pages); 0 when unknown (then nothing is checked).
std::size_t available_host_bytes();
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
  std::string path;  // "host", "nccl" (raw NCCL on a plain stream), "gtp_stream" (see nccl_bench.h), or
                     // "host_wire" / "gtp_wire" for --format rows
  // --format rows: pack + one all-gather of the wire chunks + unpack to the BF16 weight. time_us, algbw
  // and busbw are end to end (S = the BF16 weight materialized).
  struct Wire {
    std::size_t wire_bytes = 0;  // gathered: chunk_bytes x ranks
    double pack_us = 0, gather_us = 0, unpack_us = 0, e2e_us = 0;
    double e2e_ratio_to_bf16 = 0;  // time of the BF16 gather of the same weight (same run) / e2e_us
  };
  std::optional<Wire> wire;
};

// Collective over `bootstrap` (every rank of the job): averages the time over ranks and sums the wrong
// counts; busbw uses `group_size`, the ranks of the collective.
BenchRow summarize(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point, double mean_us,
                   long long wrong, const std::string& path, int group_size);

// Collective over `bootstrap`: each value averaged over ranks.
std::vector<double> average_over_ranks(comm::Bootstrap& bootstrap, const std::vector<double>& values);

// The host-transport path: `comm` spans this rank's group, `bootstrap` the whole job; every rank gets
// the same rows. With --format, each size adds the wire row (wire_bench.h).
std::vector<BenchRow> run_host_bench(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options);

// `ranks`: of the job; `group`: the collective's group ("world" or the --group) and its size.
std::string format_header(const BenchOptions& options, int ranks, const std::string& transport, int group_size);
std::string format_row(const BenchRow& row);
nlohmann::json to_json(const BenchOptions& options, int ranks, const std::vector<BenchRow>& rows,
                       const std::string& command, const std::string& transport, int group_size);

}  // namespace gtp::bench

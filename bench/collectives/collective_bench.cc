#include "bench/collectives/collective_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "bench/collectives/wire_bench.h"
#include "comm/internal/bf16.h"

namespace gtp::bench {
namespace {

constexpr const char* kUsage =
    "usage: gtp-bench all_gather|reduce_scatter [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] "
    "[-c 0|1] [-d float|bfloat16] [-o sum|mean] [--json PATH] [--path auto|host|gpu] [--profile FILE] "
    "[--group FAMILY|DIM,DIM,...] [--format bf16|fp8|mxfp8|nvfp4]";

const char* type_name(comm::HostDataType type) { return type == comm::HostDataType::kFloat32 ? "float" : "bfloat16"; }

int parse_int(const std::string& flag, const std::string& text, int min) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  // Whole string, no leading blanks or '+' (strtol would skip them), no overflow.
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-') || *end != '\0' ||
      errno == ERANGE || value < min || value > 1000000000) {
    throw std::invalid_argument(flag + " " + text + ": pass a whole number in [" + std::to_string(min) +
                                ", 1000000000]\n" + kUsage);
  }
  return static_cast<int>(value);
}

// Deterministic input of `rank` at `index`: every rank can recompute anyone's data for the check.
float input_value(int rank, std::size_t index) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) << 40) ^ (index * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x % 2001) / 500.0f - 2.0f;  // in [-2, 2], never all zeros
}

void fill(std::vector<unsigned char>& buffer, comm::HostDataType type, int rank, std::size_t first_index) {
  const std::size_t n = buffer.size() / type_size(type);
  for (std::size_t i = 0; i < n; ++i) {
    const float value = input_value(rank, first_index + i);
    if (type == comm::HostDataType::kFloat32) {
      reinterpret_cast<float*>(buffer.data())[i] = value;
    } else {
      reinterpret_cast<std::uint16_t*>(buffer.data())[i] = comm::internal::float_to_bf16(value);
    }
  }
}

float element(const std::vector<unsigned char>& buffer, comm::HostDataType type, std::size_t i) {
  return type == comm::HostDataType::kFloat32
             ? reinterpret_cast<const float*>(buffer.data())[i]
             : comm::internal::bf16_to_float(reinterpret_cast<const std::uint16_t*>(buffer.data())[i]);
}

float rounded(float value, comm::HostDataType type) {
  return type == comm::HostDataType::kFloat32 ? value
                                              : comm::internal::bf16_to_float(comm::internal::float_to_bf16(value));
}

}  // namespace

std::size_t type_size(comm::HostDataType type) { return type == comm::HostDataType::kFloat32 ? 4 : 2; }

std::size_t parse_size(const std::string& text) {
  // Digits and one optional unit: no fractions, exponents, signs, inf or nan (a size is whole bytes).
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string suffix = text.substr(digits);
  int shift = -1;
  if (suffix.empty()) shift = 0;
  else if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  const std::string range = ": pass a whole number of bytes in [1, 1T] (1T = 2^40), optionally with K, M or G "
                            "(for example 64M)";
  if (digits == 0 || shift < 0) throw std::invalid_argument("size \"" + text + "\"" + range);
  // At most 2^40 bytes: the sweep multiplies sizes by -f, which must not overflow.
  const std::size_t value = digits > 13 ? kMaxBytes + 1 : std::stoull(text.substr(0, digits));
  if (value == 0 || value > (kMaxBytes >> shift)) throw std::invalid_argument("size \"" + text + "\"" + range);
  return value << shift;
}

BenchOptions parse_bench_args(const std::vector<std::string>& args) {
  if (args.empty()) throw std::invalid_argument(std::string("no collective given\n") + kUsage);
  BenchOptions options;
  if (args[0] == "all_gather") {
    options.collective = Collective::kAllGather;
  } else if (args[0] == "reduce_scatter") {
    options.collective = Collective::kReduceScatter;
  } else {
    throw std::invalid_argument("unknown collective \"" + args[0] + "\": pass all_gather or reduce_scatter\n" + kUsage);
  }
  bool type_given = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) throw std::invalid_argument(flag + " needs a value\n" + kUsage);
    const std::string& value = args[++i];
    if (flag == "-b") options.min_bytes = parse_size(value);
    else if (flag == "-e") options.max_bytes = parse_size(value);
    else if (flag == "-f") options.factor = parse_int(flag, value, 2);
    else if (flag == "-n") options.iters = parse_int(flag, value, 1);
    else if (flag == "-w") options.warmup = parse_int(flag, value, 0);
    else if (flag == "-c") options.check = parse_int(flag, value, 0) != 0;
    else if (flag == "--json") options.json_path = value;
    else if (flag == "--profile") options.profile_path = value;
    else if (flag == "--group") options.group = value;
    else if (flag == "--format") {
      try {
        options.format = kernels::parse_wire_format(value);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("--format " + value + ": " + e.what() + "\n" + kUsage);
      }
    }
    else if (flag == "--path" && (value == "auto" || value == "host" || value == "gpu")) {
      options.path = value == "auto" ? BenchPath::kAuto : value == "host" ? BenchPath::kHost : BenchPath::kGpu;
    }
    else if (flag == "-d" && (value == "float" || value == "bfloat16")) {
      options.type = value == "float" ? comm::HostDataType::kFloat32 : comm::HostDataType::kBFloat16;
      type_given = true;
    } else if (flag == "-o" && (value == "sum" || value == "mean")) {
      options.op = value == "sum" ? comm::HostReduceOp::kSum : comm::HostReduceOp::kMean;
    } else {
      throw std::invalid_argument("unknown flag or value: " + flag + " " + value + "\n" + kUsage);
    }
  }
  if (options.min_bytes > options.max_bytes) {
    throw std::invalid_argument("-b " + std::to_string(options.min_bytes) + " exceeds -e " +
                                std::to_string(options.max_bytes) + ": pass -b <= -e");
  }
  if (options.group != "world" && options.profile_path.empty()) {
    throw std::invalid_argument("--group " + options.group + " needs --profile FILE (the grid comes from its "
                                "parallel sizes): pass --profile, or drop --group to use the world");
  }
  if (options.format) {
    if (options.collective != Collective::kAllGather) {
      throw std::invalid_argument("--format applies to all_gather only: drop it for reduce_scatter");
    }
    if (type_given && options.type != comm::HostDataType::kBFloat16) {
      throw std::invalid_argument("--format gathers BF16 weights: drop -d float (or pass -d bfloat16)");
    }
    options.type = comm::HostDataType::kBFloat16;
  }
  return options;
}

double bus_bandwidth_factor(int ranks) { return static_cast<double>(ranks - 1) / ranks; }

std::vector<SweepPoint> sweep(const BenchOptions& options, int ranks) {
  std::vector<SweepPoint> points;
  const std::size_t element_bytes = type_size(options.type);
  for (std::size_t requested = options.min_bytes; requested <= options.max_bytes; requested *= options.factor) {
    std::size_t per_rank_count = requested / (element_bytes * ranks);
    if (options.format) {  // whole rows of kWireCols, 32 rows per rank at a time, at least 32
      const std::size_t block = 32 * kWireCols;
      per_rank_count = std::max(block, per_rank_count / block * block);
    }
    points.push_back({per_rank_count * ranks * element_bytes, per_rank_count * ranks, per_rank_count});
    if (requested > options.max_bytes / options.factor) break;  // the next size is past -e (and may overflow)
  }
  return points;
}

std::size_t host_bytes_per_rank(const BenchOptions& options, int ranks) {
  std::size_t largest = 0;
  for (const SweepPoint& point : sweep(options, ranks)) largest = std::max(largest, point.size);
  return (options.format ? 4 : 2) * largest;
}

namespace {
std::string gib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}
}  // namespace

void check_host_memory(const BenchOptions& options, int ranks, std::size_t available) {
  const std::size_t needed = host_bytes_per_rank(options, ranks);
  if (available == 0 || needed <= available) return;
  throw std::invalid_argument("-e " + std::to_string(options.max_bytes) + " needs about " + gib(needed) +
                              " of host memory per rank (its buffers at the largest size), but this host has " +
                              gib(available) + " available: pass a smaller -e (and -b)");
}

std::size_t available_host_bytes() {
  if (std::FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), meminfo) != nullptr) {
      found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    }
    std::fclose(meminfo);
    if (found) return static_cast<std::size_t>(kib) * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

std::vector<unsigned char> make_input(const BenchOptions& options, const SweepPoint& point, int rank) {
  const bool gather = options.collective == Collective::kAllGather;
  std::vector<unsigned char> input(gather ? point.per_rank_count * type_size(options.type) : point.size);
  fill(input, options.type, rank, gather ? rank * point.per_rank_count : 0);
  return input;
}

long long count_wrong(const std::vector<unsigned char>& output, const BenchOptions& options, const SweepPoint& point,
                      int rank, int ranks, double epsilon) {
  long long wrong = 0;
  const std::size_t elements = output.size() / type_size(options.type);
  for (std::size_t i = 0; i < elements; ++i) {
    const float got = element(output, options.type, i);
    if (options.collective == Collective::kAllGather) {
      const int source = static_cast<int>(i / point.per_rank_count);
      wrong += got != rounded(input_value(source, i), options.type);
      continue;
    }
    double expected = 0, magnitude = 0;
    for (int r = 0; r < ranks; ++r) {
      const float value = rounded(input_value(r, rank * point.per_rank_count + i), options.type);
      expected += value;
      magnitude += std::fabs(value);
    }
    if (options.op == comm::HostReduceOp::kMean) {
      expected /= ranks;
      magnitude /= ranks;
    }
    // Accumulation error, plus one rounding of the result to BF16.
    const double tolerance = ranks * magnitude * epsilon +
                             (options.type == comm::HostDataType::kBFloat16 ? std::fabs(expected) / 256 : 0);
    wrong += std::fabs(got - expected) > tolerance;
  }
  return wrong;
}

std::vector<double> average_over_ranks(comm::Bootstrap& bootstrap, const std::vector<double>& values) {
  const int n = bootstrap.world_size();
  std::vector<double> everyone(values.size() * n);
  bootstrap.allgather(values.data(), everyone.data(), values.size() * sizeof(double));
  std::vector<double> mean(values.size(), 0.0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < values.size(); ++i) mean[i] += everyone[r * values.size() + i] / n;
  }
  return mean;
}

BenchRow summarize(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point, double mean_us,
                   long long wrong, const std::string& path, int group_size) {
  const int n = bootstrap.world_size();
  // nccl-tests' default: time averaged over ranks; #wrong summed over ranks.
  struct Sample {
    double time_us;
    long long wrong;
  } mine{mean_us, wrong};
  std::vector<Sample> everyone(n);
  bootstrap.allgather(&mine, everyone.data(), sizeof(Sample));
  BenchRow row{point.size,
               point.count,
               type_name(options.type),
               options.collective == Collective::kAllGather ? "none"
               : options.op == comm::HostReduceOp::kSum    ? "sum"
                                                           : "mean",
               0,
               0,
               0,
               options.check ? 0 : -1,
               path,
               std::nullopt};
  for (const Sample& sample : everyone) {
    row.time_us += sample.time_us / n;
    if (options.check) row.wrong += sample.wrong;
  }
  row.algbw = static_cast<double>(point.size) / 1e3 / row.time_us;  // bytes / us / 1e3 = GB/s
  row.busbw = row.algbw * bus_bandwidth_factor(group_size);
  return row;
}

std::vector<BenchRow> run_host_bench(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options) {
  std::vector<BenchRow> rows;
  for (const SweepPoint& point : sweep(options, comm.size())) {
    const std::size_t element_bytes = type_size(options.type);
    const std::size_t shard_bytes = point.per_rank_count * element_bytes;
    std::vector<unsigned char> input = make_input(options, point, comm.rank());
    std::vector<unsigned char> output(options.collective == Collective::kAllGather ? point.size : shard_bytes);
    auto run_once = [&] {
      if (options.collective == Collective::kAllGather) {
        comm.all_gather(input.data(), output.data(), shard_bytes);
      } else {
        comm.reduce_scatter(input.data(), output.data(), point.per_rank_count, options.type, options.op);
      }
    };
    for (int i = 0; i < options.warmup; ++i) run_once();
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iters; ++i) run_once();
    const double mean_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / options.iters;
    long long wrong = -1;
    if (options.check) {  // a fresh iteration into a cleared output, as documented
      std::fill(output.begin(), output.end(), 0);
      run_once();
      wrong = count_wrong(output, options, point, comm.rank(), comm.size(), std::ldexp(1.0, -23));
    }
    rows.push_back(summarize(bootstrap, options, point, mean_us, wrong, "host", comm.size()));
    if (options.format) rows.push_back(run_host_wire(comm, bootstrap, options, point, rows.back().time_us));
  }
  return rows;
}

std::string format_header(const BenchOptions& options, int ranks, const std::string& transport, int group_size) {
  char line[1024];
  const std::string group = options.group == "world" ? "world" : options.group + " groups of " +
                                                                      std::to_string(group_size) + " ranks";
  const std::string format = options.format ? ", wire format " + kernels::to_string(*options.format) +
                                                  " (BF16 weight [rows, " + std::to_string(kWireCols) + "])"
                                            : "";
  std::snprintf(line, sizeof(line),
                "# gtp-bench %s: %d ranks, group: %s%s, transport: %s\n"
                "# iters %d, warmup %d, check %d; time averaged over ranks; busbw = algbw * (n-1)/n, n = group size\n"
                "#%11s %12s %9s %6s %12s %10s %10s %8s  %-10s",
                options.collective == Collective::kAllGather ? "all_gather" : "reduce_scatter", ranks, group.c_str(),
                format.c_str(), transport.c_str(), options.iters, options.warmup, options.check ? 1 : 0, "size(B)",
                "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "path");
  std::string header = line;
  if (options.format) {
    std::snprintf(line, sizeof(line), " %12s %10s %10s %10s %10s %8s", "wire(B)", "pack(us)", "gather(us)",
                  "unpack(us)", "e2e(us)", "vs_bf16");
    header += line;
  }
  while (header.back() == ' ') header.pop_back();
  return header + "\n";
}

std::string format_row(const BenchRow& row) {
  char line[512];
  const std::string wrong = row.wrong < 0 ? "N/A" : std::to_string(row.wrong);
  std::snprintf(line, sizeof(line), "%12zu %12zu %9s %6s %12.1f %10.3f %10.3f %8s  %-10s", row.size, row.count,
                row.type.c_str(), row.redop.c_str(), row.time_us, row.algbw, row.busbw, wrong.c_str(),
                row.path.c_str());
  std::string text = line;
  if (row.wire) {
    std::snprintf(line, sizeof(line), " %12zu %10.1f %10.1f %10.1f %10.1f %7.2fx", row.wire->wire_bytes,
                  row.wire->pack_us, row.wire->gather_us, row.wire->unpack_us, row.wire->e2e_us,
                  row.wire->e2e_ratio_to_bf16);
    text += line;
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text + "\n";
}

nlohmann::json to_json(const BenchOptions& options, int ranks, const std::vector<BenchRow>& rows,
                       const std::string& command, const std::string& transport, int group_size) {
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  const char* commit = std::getenv("GTP_COMMIT");
  nlohmann::json json = {
      {"command", command},
      {"commit", commit != nullptr ? commit : "unknown"},
      {"machine", {{"hostname", host}}},
      {"path", rows.empty() || rows[0].path == "host" ? "host" : "gpu"},
      {"transport", transport},
      {"collective", options.collective == Collective::kAllGather ? "all_gather" : "reduce_scatter"},
      {"ranks", ranks},
      {"group", options.group},
      {"group_size", group_size},
      {"profile", options.profile_path},
      {"format", options.format ? kernels::to_string(*options.format) : ""},
      {"iters", options.iters},
      {"warmup", options.warmup},
      {"busbw_factor", bus_bandwidth_factor(group_size)},
      {"results", nlohmann::json::array()},
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const BenchRow& row = rows[i];
    json["results"].push_back({{"size", row.size},
                               {"count", row.count},
                               {"type", row.type},
                               {"redop", row.redop},
                               {"time_us", row.time_us},
                               {"algbw_gbps", row.algbw},
                               {"busbw_gbps", row.busbw},
                               {"wrong", row.wrong},
                               {"path", row.path}});
    if (row.wire) {
      json["results"].back().update({{"wire_bytes", row.wire->wire_bytes},
                                     {"pack_us", row.wire->pack_us},
                                     {"gather_us", row.wire->gather_us},
                                     {"unpack_us", row.wire->unpack_us},
                                     {"e2e_us", row.wire->e2e_us},
                                     {"e2e_ratio_to_bf16", row.wire->e2e_ratio_to_bf16}});
    }
    // The GPU path measures each size twice: raw NCCL, then through libgtp's streams. The ratio of
    // bandwidths (algbw: busbw is 0 for a single rank) is the share of raw NCCL that libgtp keeps.
    if (row.path == "gtp_stream" && i > 0 && rows[i - 1].path == "nccl" && rows[i - 1].algbw > 0) {
      json["results"].back()["bw_ratio_to_nccl"] = row.algbw / rows[i - 1].algbw;
    }
  }
  return json;
}

}  // namespace gtp::bench

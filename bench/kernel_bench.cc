// gtp-kernel-bench: times pack and unpack of every wire format for BF16 shards of several sizes,
// against a device-to-device copy of the same bytes timed in the same run (the 100 % line): each
// row's op moves `bytes` (read + written), and its copy line is a cudaMemcpyAsync of bytes / 2,
// because a small copy runs below the large copy's rate (launch and tail cost a fixed few µs).
// The shard-sized copy's rate is reported beside it for comparison across rows.
// Without a GPU it times the CPU reference path instead and says so.
//
//   gtp-kernel-bench [--sizes-mib 4,16,64,256] [--iters N] [--warmup N] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/codecs.h"
#include "kernels/cuda_kernels.h"
#include "kernels/reference.h"

namespace {

using namespace gtp::kernels;
using json = nlohmann::json;

constexpr int64_t kCols = 4096;
constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kRotationBytes = 512 * kMiB;  // well past the 60 MB L2: every run reads DRAM

struct Options {
  std::vector<int64_t> sizes_mib = {4, 16, 64, 256};
  int iters = 50;
  int warmup = 10;
  std::string json_path;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "gtp-kernel-bench: %s\nusage: gtp-kernel-bench [--sizes-mib 4,16,64,256] "
               "[--iters N] [--warmup N] [--json FILE]\n",
               message.c_str());
  std::exit(2);
}

int parse_positive(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v <= 0 || v > 1000000) {
    usage_error(flag + "=" + value + " is not a positive integer (1..1000000)");
  }
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("usage: gtp-kernel-bench [--sizes-mib 4,16,64,256] [--iters N] [--warmup N] "
                  "[--json FILE]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--sizes-mib") {
      o.sizes_mib.clear();
      std::stringstream s(value);
      for (std::string item; std::getline(s, item, ',');) {
        o.sizes_mib.push_back(parse_positive("--sizes-mib", item));
      }
    } else if (flag == "--iters") {
      o.iters = parse_positive(flag, value);
    } else if (flag == "--warmup") {
      o.warmup = parse_positive(flag, value);
    } else if (flag == "--json") {
      o.json_path = value;
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  return o;
}

struct Variant {
  std::string name;
  WireSpec spec;
};

const Variant kVariants[] = {
    {"bf16", {WireFormat::kBF16}},
    {"fp8", {WireFormat::kFP8}},
    {"mxfp8", {WireFormat::kMXFP8, ScaleRounding::kRceil}},
    {"nvfp4_1d", {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k1D}},
    {"nvfp4_2d", {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D}},
};

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gtp-kernel-bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// Median time in microseconds of `op(i)` over iters runs after warmup, by CUDA events around
// each run (i selects the rotating buffer set).
double median_us(const std::function<void(int)>& op, int warmup, int iters) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) op(i);
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(start), "cudaEventRecord");
    op(warmup + i);
    cuda_check(cudaEventRecord(stop), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = codec::float_to_bf16(normal(rng));
  return v;
}

struct Row {
  std::string format, op;
  int64_t shard_mib;
  double bytes, us, gbps, copy_gbps, percent_of_copy;
  double shard_copy_gbps, percent_of_shard_copy;
};

void print_row(const Row& r) {
  std::printf("%-9s %-21s %6ld %12.0f %10.1f %9.1f %9.1f %7.1f%% %7.1f%%\n", r.format.c_str(),
              r.op.c_str(), static_cast<long>(r.shard_mib), r.bytes, r.us, r.gbps, r.copy_gbps,
              r.percent_of_copy, r.percent_of_shard_copy);
}

std::vector<Row> run_gpu(const Options& o, json& machine) {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0;
  cudaDriverGetVersion(&driver);
  machine = {{"gpu", prop.name}, {"sms", prop.multiProcessorCount},
             {"l2_bytes", prop.l2CacheSize}, {"driver", driver}};
  std::printf("GPU path: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::printf("%-9s %-21s %6s %12s %10s %9s %9s %8s %8s\n", "format", "op", "MiB", "bytes", "us",
              "GB/s", "copyGB/s", "of copy", "of shard copy");
  std::vector<Row> rows;
  for (int64_t mib : o.sizes_mib) {
    const int64_t shard_bytes = mib * kMiB;
    const int64_t rows_n = shard_bytes / 2 / kCols;
    const int64_t sets = std::max<int64_t>(2, kRotationBytes / shard_bytes);
    // Sources, and the largest destination any variant needs (BF16 chunks / unpacked weights).
    void* src = nullptr;
    void* dst = nullptr;
    cuda_check(cudaMalloc(&src, shard_bytes * sets), "cudaMalloc(src)");
    // Each destination slot holds the largest output set: a BF16 weight, or GEMM data, scales,
    // transposed data and scales and the decode scales at fixed offsets (see gemm below).
    const int64_t slot = 2 * shard_bytes + 4096;
    cuda_check(cudaMalloc(&dst, slot * sets), "cudaMalloc(dst)");
    const std::vector<uint16_t> host = random_bf16(rows_n * kCols, 42 + mib);
    for (int64_t s = 0; s < sets; ++s) {
      cuda_check(cudaMemcpy(static_cast<uint8_t*>(src) + s * shard_bytes, host.data(), shard_bytes,
                            cudaMemcpyHostToDevice), "upload");
    }
    auto src_at = [&](int i) { return static_cast<uint8_t*>(src) + (i % sets) * shard_bytes; };
    auto dst_at = [&](int i) { return static_cast<uint8_t*>(dst) + (i % sets) * slot; };

    // The copy line of an op that moves `bytes`: a device copy of bytes / 2 (whole 256-byte
    // lines), timed once per distinct size on the same rotating buffers.
    std::vector<std::pair<int64_t, double>> copy_rates;
    auto copy_gbps_for = [&](double bytes) {
      const int64_t half = std::min<int64_t>(shard_bytes, (static_cast<int64_t>(bytes / 2) + 255) / 256 * 256);
      for (const auto& [size, rate] : copy_rates) if (size == half) return rate;
      const double us = median_us(
          [&](int i) { cudaMemcpyAsync(dst_at(i), src_at(i), half, cudaMemcpyDeviceToDevice); },
          o.warmup, o.iters);
      copy_rates.emplace_back(half, 2.0 * half / us / 1e3);
      return copy_rates.back().second;
    };
    const double shard_copy_gbps = copy_gbps_for(2.0 * shard_bytes);
    Row copy{"-", "d2d_copy", mib, 2.0 * shard_bytes, 2.0 * shard_bytes / shard_copy_gbps / 1e3,
             shard_copy_gbps, shard_copy_gbps, 100.0, shard_copy_gbps, 100.0};
    print_row(copy);
    rows.push_back(copy);

    for (const Variant& v : kVariants) {
      const WeightGeometry geometry = weight_geometry(v.spec.format, rows_n, kCols, 1);
      const ChunkLayout layout = chunk_layout(v.spec, geometry.shard_rows, kCols);
      // Chunks to unpack: pack each source set once into the source area's twin (dst is reused
      // for outputs), so unpack reads real codes.
      void* chunks = nullptr;
      cuda_check(cudaMalloc(&chunks, layout.chunk_bytes * sets), "cudaMalloc(chunks)");
      float* amax = nullptr;
      cuda_check(cudaMalloc(&amax, sizeof(float)), "cudaMalloc(amax)");
      amax_cuda(src_at(0), SourceDtype::kBF16, rows_n, kCols, amax, nullptr);
      auto pack_into = [&](int i, uint8_t* out, const float* given_amax) {
        PackArgs a;
        a.shard = src_at(i);
        a.shard_rows = geometry.shard_rows;
        a.valid_rows = geometry.valid_rows(0);
        a.cols = kCols;
        a.amax = given_amax;
        a.chunk = out;
        a.chunk_capacity = layout.chunk_bytes;
        pack_cuda(v.spec, a, nullptr);
      };
      auto chunk_at = [&](int i) { return static_cast<uint8_t*>(chunks) + (i % sets) * layout.chunk_bytes; };
      for (int64_t s = 0; s < sets; ++s) pack_into(static_cast<int>(s), chunk_at(static_cast<int>(s)), nullptr);
      cuda_check(cudaDeviceSynchronize(), "pack warm-up");

      const double io = static_cast<double>(shard_bytes + layout.chunk_bytes);
      auto add = [&](const std::string& op, double bytes, double us) {
        const double gbps = bytes / us / 1e3;
        const double copy_gbps = copy_gbps_for(bytes);
        Row r{v.name, op, mib, bytes, us, gbps, copy_gbps, 100.0 * gbps / copy_gbps,
              shard_copy_gbps, 100.0 * gbps / shard_copy_gbps};
        print_row(r);
        rows.push_back(r);
      };
      add("pack", io, median_us([&](int i) { pack_into(i, dst_at(i), nullptr); }, o.warmup, o.iters));
      if (v.spec.format == WireFormat::kFP8 || v.spec.format == WireFormat::kNVFP4) {
        add("pack_given_amax", io,
            median_us([&](int i) { pack_into(i, dst_at(i), amax); }, o.warmup, o.iters));
      }
      add("unpack_bf16", io, median_us([&](int i) {
            unpack_cuda(v.spec, {chunk_at(i), layout.chunk_bytes, geometry}, dst_at(i),
                        shard_bytes, nullptr);
          }, o.warmup, o.iters));
      // The GEMM layout, and for formats with block scales also with the blocked 128x4 scales
      // (rows "..._blocked").
      for (ScaleLayout scale_layout : {ScaleLayout::kRowMajor, ScaleLayout::kBlocked128x4}) {
        if (v.spec.format == WireFormat::kBF16) break;
        const GemmLayoutSizes sizes = gemm_layout_sizes(v.spec, geometry, scale_layout);
        const bool blocked = scale_layout == ScaleLayout::kBlocked128x4;
        if (blocked && sizes.scale_rows == 0) break;
        // Outputs: data and transposed data side by side in the destination area.
        auto gemm = [&](int i, bool transpose) {
          uint8_t* base = dst_at(i);
          // data <= shard/2 at 0, scales <= shard/16 at shard/2, transposed data <= shard/2 at
          // shard, transposed scales at 3/2 shard, decode scales at 2 shard.
          GemmOutputs out{base, sizes.data_bytes, base + shard_bytes / 2, sizes.scales_bytes,
                          transpose ? base + shard_bytes : nullptr, sizes.transposed_data_bytes,
                          base + 3 * shard_bytes / 2, sizes.transposed_scales_bytes,
                          reinterpret_cast<float*>(base + 2 * shard_bytes), 1, scale_layout};
          unpack_gemm_cuda(v.spec, {chunk_at(i), layout.chunk_bytes, geometry}, out, nullptr);
        };
        const std::string suffix = blocked ? "_blocked" : "";
        const double gemm_bytes = layout.chunk_bytes + sizes.data_bytes + sizes.scales_bytes;
        add("unpack_gemm" + suffix, gemm_bytes, median_us([&](int i) { gemm(i, false); }, o.warmup, o.iters));
        if (sizes.transpose_supported) {
          add("unpack_gemm_t" + suffix,
              gemm_bytes + sizes.transposed_data_bytes + sizes.transposed_scales_bytes,
              median_us([&](int i) { gemm(i, true); }, o.warmup, o.iters));
        }
      }
      cuda_check(cudaGetLastError(), "benchmark launches");
      cudaFree(amax);
      cudaFree(chunks);
    }
    cudaFree(src);
    cudaFree(dst);
  }
  return rows;
}

// CPU reference path: the spec run element by element (for machines without a GPU).
std::vector<Row> run_cpu(const Options& o, const std::string& why, json& machine) {
  machine = {{"gpu", nullptr}, {"why_no_gpu", why}};
  std::printf("CPU reference path (no GPU: %s); timings are host timings of the spec\n",
              why.c_str());
  std::printf("%-9s %-16s %6s %12s %10s %9s\n", "format", "op", "MiB", "bytes", "us", "GB/s");
  std::vector<Row> rows;
  const int64_t mib = std::min<int64_t>(4, o.sizes_mib.front());
  const int64_t rows_n = mib * kMiB / 2 / kCols;
  const std::vector<uint16_t> host = random_bf16(rows_n * kCols, 42);
  for (const Variant& v : kVariants) {
    const WeightGeometry geometry = weight_geometry(v.spec.format, rows_n, kCols, 1);
    const ChunkLayout layout = chunk_layout(v.spec, geometry.shard_rows, kCols);
    std::vector<uint8_t> chunk(layout.chunk_bytes + 16), out(mib * kMiB + 16);
    uint8_t* chunk_p = chunk.data() + (16 - reinterpret_cast<uintptr_t>(chunk.data()) % 16) % 16;
    uint8_t* out_p = out.data() + (16 - reinterpret_cast<uintptr_t>(out.data()) % 16) % 16;
    PackArgs a;
    a.shard = host.data();
    a.shard_rows = geometry.shard_rows;
    a.valid_rows = rows_n;
    a.cols = kCols;
    a.chunk = chunk_p;
    a.chunk_capacity = layout.chunk_bytes;
    auto time_us = [](const std::function<void()>& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    const double io = static_cast<double>(mib * kMiB + layout.chunk_bytes);
    const double pack_us = time_us([&] { pack_reference(v.spec, a); });
    const double unpack_us = time_us([&] {
      unpack_reference(v.spec, {chunk_p, layout.chunk_bytes, geometry}, out_p, mib * kMiB);
    });
    for (auto [op, us] : {std::pair<const char*, double>{"pack", pack_us}, {"unpack_bf16", unpack_us}}) {
      Row r{v.name, op, mib, io, us, io / us / 1e3, 0, 0, 0, 0};
      std::printf("%-9s %-16s %6ld %12.0f %10.1f %9.2f\n", r.format.c_str(), r.op.c_str(),
                  static_cast<long>(mib), r.bytes, r.us, r.gbps);
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::string why;
  json machine;
  const bool gpu = cuda_device_available(&why);
  const std::vector<Row> rows = gpu ? run_gpu(o, machine) : run_cpu(o, why, machine);
  if (!o.json_path.empty()) {
    json results = json::array();
    for (const Row& r : rows) {
      results.push_back({{"format", r.format}, {"op", r.op}, {"shard_mib", r.shard_mib},
                         {"bytes", r.bytes}, {"median_us", r.us}, {"gbps", r.gbps},
                         {"copy_gbps", r.copy_gbps}, {"percent_of_copy", r.percent_of_copy},
                         {"shard_copy_gbps", r.shard_copy_gbps},
                         {"percent_of_shard_copy", r.percent_of_shard_copy}});
    }
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const char* commit = std::getenv("GTP_COMMIT");
    const json doc = {{"tool", "gtp-kernel-bench"}, {"path", gpu ? "gpu" : "cpu-reference"},
                      {"machine", machine}, {"commit", commit ? commit : "unknown"},
                      {"command", command}, {"iters", o.iters}, {"warmup", o.warmup},
                      {"results", results}};
    std::ofstream(o.json_path) << doc.dump(2) << "\n";
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  return 0;
}

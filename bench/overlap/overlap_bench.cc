// gtp-overlap-bench: does the prefetched gather hide behind the GEMMs? A chain of L linear layers
// (cuBLAS BF16 GEMMs on one consumer stream) runs forward and backward (dgrad, and an FP32 wgrad)
// twice: with resident weights (wgrad accumulated, beta = 1), and with weights materialized by libgtp
// through the C ABI (materialize / release around each GEMM, wgrad into gtp_grad_buffer_ex without
// the zero-fill: beta = 0 when `overwrite`, 1 otherwise; then gtp_finalize; gtp_drain ends the step). See docs/performance.md, "Overlap benchmark".
//
// Exposed communication is measured on the consumer stream: an event recorded just before
// gtp_materialize and one just after it returns bracket exactly what materialize enqueued there
// (the wait on the gathered slot's ready event); their elapsed time is how long the consumer
// stream stood still because the gather was not done. gtp_grad_buffer_ex (only the padding rows are
// zeroed, on the side stream) and gtp_drain (the consumer waits on the side stream) are bracketed the same way.
// The resident chain records the same event pairs around nothing: that is the measurement floor.
// The step itself (run_step) and the libgtp calls (GtpWeights) live in chain.h, device-free, so
// chain_test runs the same sequence on the host backend.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/overlap/chain.h"
#include "bench/overlap/device_chain.h"
#include "bench/overlap/overlap_options.h"
#include "gtp/gtp.h"
#include "kernels/wire_format.h"

namespace {

using namespace gtp::bench::overlap;
using gtp::kernels::WireFormat;

std::string env_or(const char* a, const char* b) {
  for (const char* name : {a, b}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return v;
  }
  return "";
}

int env_int(const char* a, const char* b, int fallback) {
  const std::string v = env_or(a, b);
  if (v.empty()) return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string(a) + "/" + b + " is '" + v + "', not an integer");
  }
}

int run(const Options& o, int argc, char** argv) {
  // Ranks: one in this process (callbacks), or the launcher's environment (ucx).
  int world = 1, rank = 0;
  if (o.bootstrap == Bootstrap::kUcxFromEnv) {
    world = env_int("GTP_WORLD_SIZE", "WORLD_SIZE", 0);
    rank = env_int("GTP_RANK", "RANK", -1);
    if (world < 1 || rank < 0 || rank >= world) {
      throw std::invalid_argument(
          "--bootstrap ucx needs GTP_RANK and GTP_WORLD_SIZE (or RANK/WORLD_SIZE); run under gtp-launch");
    }
  }
  const bool lead = rank == 0;
  int devices = 0;
  CUDA(cudaGetDeviceCount(&devices));
  const int device = env_int("GTP_LOCAL_RANK", "LOCAL_RANK", rank) % devices;
  CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CUDA(cudaGetDeviceProperties(&prop, device));
  int least_priority = 0, greatest_priority = 0, driver = 0, runtime = 0;
  CUDA(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  CUDA(cudaDriverGetVersion(&driver));
  CUDA(cudaRuntimeGetVersion(&runtime));
  cudaStream_t stream = nullptr;  // the consumer stream, at the default (least) priority
  CUDA(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least_priority));
  cublasHandle_t handle = nullptr;
  CUBLAS(cublasCreate(&handle));
  CUBLAS(cublasSetStream(handle, stream));
  int cublas_version = 0;
  CUBLAS(cublasGetVersion(handle, &cublas_version));
  char hostname[256] = {0};
  gethostname(hostname, sizeof hostname - 1);
  auto say = [&](const char* fmt, auto... args) {
    if (lead) std::printf(fmt, args...);
  };
  say("gtp-overlap-bench on %s: %s (%d SMs, %.0f GiB), rank %d of %d, stream priorities %d (high) .. %d (default)\n",
      hostname, prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, rank, world, greatest_priority,
      least_priority);
  if (world == 1) {
    say("one rank: the gather goes through a size-1 communicator, i.e. a device copy (no NVLink); measured anyway\n");
  }

  // Rates for sizing: a device-to-device copy of one weight, and the forward GEMM.
  const std::int64_t elements = o.n * o.k;
  const std::int64_t m_max = 16384;
  const std::int64_t m_buf = o.m > 0 ? o.m : m_max;
  double copy_rate = 0, gather_model_s = 0;
  std::int64_t m = o.m;
  json sizing;
  {
    DeviceBuffer src(elements * 2), dst(elements * 2);
    CUDA(cudaMemset(src.ptr, 0, static_cast<size_t>(elements * 2)));
    const double copy_s = time_on(stream, [&] {
      CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, static_cast<size_t>(elements * 2), cudaMemcpyDeviceToDevice, stream));
    });
    copy_rate = elements * 2 / copy_s;
    const double busbw = (o.gather_gbps > 0 ? o.gather_gbps : 360.0) * 1e9;
    gather_model_s = gather_seconds(elements, world, copy_rate, busbw);
    DeviceBuffer x(m_buf * std::max(o.n, o.k) * 2), y(m_buf * std::max(o.n, o.k) * 2);
    const std::vector<std::uint16_t> host = random_bf16(elements, 0.05f, 3);
    CUDA(cudaMemcpy(src.ptr, host.data(), static_cast<size_t>(elements * 2), cudaMemcpyHostToDevice));
    // Random activations too: GEMMs on zeros draw less power and run faster than on real data.
    for (std::int64_t done = 0, total = m_buf * std::max(o.n, o.k); done < total; done += elements) {
      CUDA(cudaMemcpy(x.as<std::uint16_t>() + done, src.ptr, static_cast<size_t>(std::min(elements, total - done) * 2),
                      cudaMemcpyDeviceToDevice));
    }
    auto rate = [&](std::int64_t mm) {
      const Gemms g(handle, mm);
      const double s = time_on(stream, [&] { g.forward(src.ptr, x.ptr, y.ptr, LayerShape{o.n, o.k}); });
      return 2.0 * mm * o.n * o.k / s;
    };
    if (m == 0) {
      if (world > 1)
        say("warning: --m auto on %d ranks: each rank sizes on its own GPU; pass --m to be sure they agree\n", world);
      const Sizing s = choose_m(o.n, o.k, gather_model_s, m_max, rate);
      m = s.m;
      json steps = json::array();
      for (const auto& st : s.steps)
        steps.push_back({{"m", st.m}, {"tflops", st.flops_per_s / 1e12}, {"gemm_us", st.gemm_seconds * 1e6}});
      sizing = {{"mode", "auto"}, {"why", s.why}, {"steps", steps}};
      say("auto-size: %s\n", s.why.c_str());
    } else {
      sizing = {{"mode", "fixed"}, {"why", "--m given"}};
    }
    const double gemm_rate = rate(m);
    sizing["m"] = m;
    sizing["n"] = o.n;
    sizing["k"] = o.k;
    sizing["layers"] = o.layers;
    sizing["microbatches"] = o.microbatches;
    sizing["copy_gbytes_per_s"] = copy_rate / 1e9;
    sizing["gather_busbw_gbytes_per_s"] = world > 1 ? busbw / 1e9 : 0.0;
    sizing["gather_model_us"] = gather_model_s * 1e6;
    sizing["gemm_us"] = 2.0 * m * o.n * o.k / gemm_rate * 1e6;
    sizing["gemm_tflops"] = gemm_rate / 1e12;
    say("sizes: M %lld, N %lld, K %lld, %d layers (weights %lldx%lld and %lldx%lld alternating, %.1f MiB BF16 each), "
        "%d microbatch(es) per step\n",
        (long long)m, (long long)o.n, (long long)o.k, o.layers, (long long)o.n, (long long)o.k, (long long)o.k,
        (long long)o.n, elements * 2 / 1048576.0, o.microbatches);
    say("rates: device copy %.0f GB/s; modeled gather %.1f us; forward GEMM %.1f us at %.0f TFLOP/s\n", copy_rate / 1e9,
        gather_model_s * 1e6, sizing["gemm_us"].get<double>(), gemm_rate / 1e12);
  }

  const std::vector<std::uint16_t> host_weight =
      random_bf16(elements, 1.0f / std::sqrt(static_cast<float>(std::max(o.n, o.k))), 11);
  Activations acts = make_activations(o, m);
  const Gemms gemms(handle, m);
  json configs = json::array();
  int exit_code = 0;

  // GTP off: resident weights.
  StepTimes resident;
  {
    const std::int64_t before = free_device_bytes();
    std::int64_t least = before;
    Resident weights(o, host_weight);
    least = std::min(least, free_device_bytes());
    resident = run_steps(o, gemms, acts, weights, stream, before, least);
    json c = step_json(resident);
    c["mode"] = "resident";
    configs.push_back(c);
    say("%-9s %-6s %-6s %5s  step %9.1f us  exposed %7.1f us (event floor)  peak %7.1f MiB\n", "resident", "-", "-",
        "-", resident.step, resident.exposed_materialize + resident.exposed_grad_buffer + resident.exposed_drain,
        resident.peak_bytes / 1048576.0);
  }

  // GTP on: every wire, priority and depth; depth 0 (every gather on demand, fully exposed) first,
  // as the measure of the communication there is to hide.
  std::vector<int> depths = {0};
  for (int d : o.depths) {
    if (d != 0) depths.push_back(d);
  }
  std::string gtp_error;
  for (WireFormat wire : o.wires) {
    for (const std::string& priority : o.priorities) {
      double all_exposed = 0;  // depth 0's materialize wait
      for (int depth : depths) {
        json c = {{"mode", "gtp"},
                  {"wire", gtp::kernels::to_string(wire)},
                  {"prefetch_depth", depth},
                  {"stream_priority", priority},
                  {"keep_gathered", o.switches.keep_gathered},
                  {"grads_into_main_grad", o.switches.grads_into_main_grad},
                  {"repack_every_step", o.repack},
                  {"reference", depth == 0}};
        if (!gtp_error.empty()) {
          c["error"] = gtp_error;
          configs.push_back(c);
          continue;
        }
        try {
          const std::int64_t before = free_device_bytes();
          std::int64_t least = before;
          std::vector<std::unique_ptr<DeviceBuffer>> buffers;  // declared first: outlives the context
          gtp_bootstrap_callbacks_t callbacks = one_rank_callbacks();
          gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
          config.bootstrap =
              o.bootstrap == Bootstrap::kCallbacks ? GTP_BOOTSTRAP_CALLBACKS : GTP_BOOTSTRAP_UCX_FROM_ENV;
          config.callbacks = o.bootstrap == Bootstrap::kCallbacks ? &callbacks : nullptr;
          config.timeout_ms = o.timeout_ms;
          config.backend = GTP_BACKEND_CUDA;
          config.accumulate_microbatches = o.microbatches > 1;
          std::vector<LayerShape> shapes;
          for (int i = 0; i < o.layers; ++i) shapes.push_back(layer_shape(o, i));
          GtpWeights weights(config, world, priority, depth, wire, shapes, stream, o.switches, o.repack);
          // This rank's rows of the (same on every rank) full weights, and FP32 main grads.
          std::vector<const void*> shards;
          std::vector<float*> main_grads;
          for (int i = 0; i < o.layers; ++i) {
            const GtpWeights::Rows rows = weights.rows(i);
            const std::int64_t cols = shapes[static_cast<size_t>(i)].in_features,
                               held = std::max<std::int64_t>(rows.count, 1);
            buffers.push_back(std::make_unique<DeviceBuffer>(held * cols * 2));
            if (rows.count > 0) {
              CUDA(cudaMemcpy(buffers.back()->ptr, host_weight.data() + rows.first * cols,
                              static_cast<size_t>(rows.count * cols * 2), cudaMemcpyHostToDevice));
            }
            shards.push_back(rows.count > 0 ? buffers.back()->ptr : nullptr);
            buffers.push_back(std::make_unique<DeviceBuffer>(held * cols * 4));
            CUDA(cudaMemset(buffers.back()->ptr, 0, static_cast<size_t>(held * cols * 4)));
            main_grads.push_back(buffers.back()->as<float>());
          }
          weights.register_and_pack(shards, main_grads);
          least = std::min(least, free_device_bytes());
          const StepTimes t = run_steps(o, gemms, acts, weights, stream, before, least);
          c.update(step_json(t));
          if (depth == 0) all_exposed = t.exposed_materialize;
          const double exposed = t.exposed_materialize + t.exposed_grad_buffer + t.exposed_drain;
          const double overlap = all_exposed > 0 ? 100.0 * (1.0 - t.exposed_materialize / all_exposed) : 0.0;
          const double ratio = t.step / resident.step;
          const double gather_us = all_exposed / (2.0 * o.layers * o.microbatches);
          c["gather_us_per_call_at_depth0"] = gather_us;
          c["gather_le_gemm"] = gather_us <= sizing["gemm_us"].get<double>();
          c["overlap_pct"] = all_exposed > 0 ? json(overlap) : json(nullptr);  // null: no depth-0 reference
          c["step_ratio_vs_resident"] = ratio;
          c["materialize_host_us_median"] = median(weights.materialize_host_us());
          c["runtime_stats"] = json::parse(weights.stats_json());
          c["targets"] = {{"exposed_le_3pct_of_step", exposed <= 0.03 * t.step}, {"step_ratio_le_1_03", ratio <= 1.03}};
          say("%-9s %-6s %-6s %5d  step %9.1f us  exposed %7.1f us (%5.2f %%)  overlap %6.2f %%  x%.3f  peak %7.1f "
              "MiB\n",
              o.switches.keep_gathered ? "gtp+keep" : "gtp", gtp::kernels::to_string(wire).c_str(), priority.c_str(),
              depth,
              t.step, exposed,
              100.0 * exposed / t.step, overlap, ratio, t.peak_bytes / 1048576.0);
        } catch (const GtpError& e) {
          // A context that cannot be created (e.g. a libgtp without GTP_BACKEND_CUDA) fails every
          // configuration the same way: record it, skip the rest, keep the resident numbers.
          c["error"] = e.what();
          say("gtp: %s\n", e.what());
          if (std::string(e.what()).rfind("gtp_context_create", 0) == 0) gtp_error = e.what();
          exit_code = 3;
        } catch (const std::runtime_error& e) {
          // CUDA or cuBLAS failed: later configurations would not be trustworthy.
          c["error"] = e.what();
          say("gtp: %s\n", e.what());
          gtp_error = std::string("skipped after an earlier failure: ") + e.what();
          exit_code = 3;
        }
        configs.push_back(c);
      }
    }
  }

  if (lead && !o.json_path.empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const char* commit = std::getenv("GTP_COMMIT");
    const json doc = {
        {"tool", "gtp-overlap-bench"},
        {"machine",
         {{"hostname", hostname},
          {"gpu", prop.name},
          {"sm_count", prop.multiProcessorCount},
          {"memory_bytes", prop.totalGlobalMem},
          {"cuda_driver", driver},
          {"cuda_runtime", runtime},
          {"cublas", cublas_version},
          {"stream_priority_range", {{"greatest", greatest_priority}, {"least", least_priority}}}}},
        {"commit", commit ? commit : "unknown"},
        {"command", command},
        {"world_size", world},
        {"one_rank_gather_is_a_device_copy", world == 1},
        {"sizing", sizing},
        {"measurement",
         "step: events at the start and end of a step on the consumer stream (median of iters after warmup); exposed: "
         "events on the consumer stream just before and just after gtp_materialize, gtp_grad_buffer_ex and gtp_drain "
         "(what they enqueue there is the wait on the side stream), summed per step; overlap: 1 - exposed "
         "materialize wait / the same at depth 0 (every gather on demand); peak memory: free memory before the "
         "configuration minus the least free memory seen (cudaMemGetInfo after each step)"},
        {"targets", {{"exposed_pct_of_step", 3.0}, {"step_ratio_vs_resident", 1.03}}},
        {"configs", configs}};
    std::ofstream(o.json_path) << doc.dump(2) << "\n";
    say("wrote %s\n", o.json_path.c_str());
  }
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-overlap-bench: %s\n%s", e.what(), usage().c_str());
    return 1;
  }
  if (o.help) {
    std::printf("%s", usage().c_str());
    return 0;
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gtp-overlap-bench: no CUDA device (%s): this benchmark times GEMMs and gathers on a GPU\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    return 2;
  }
  try {
    return run(o, argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-overlap-bench: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gtp-overlap-bench: %s\n", e.what());
    return 3;
  }
}

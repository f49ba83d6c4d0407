// The overlap benchmark's device side (gtp-overlap-bench, libgtp through the C ABI): device buffers
// and events, cuBLAS GEMMs of the chain, its activations, the resident-weight source, and the timed
// steps.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/overlap/chain.h"
#include "bench/overlap/overlap_options.h"

namespace gtp::bench::overlap {

using json = nlohmann::json;

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}
#define CUDA(call) cuda_check((call), #call)
#define CUBLAS(call) cublas_check((call), #call)

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::int64_t bytes) { CUDA(cudaMalloc(&ptr, static_cast<size_t>(bytes))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

struct Events {
  std::vector<cudaEvent_t> events;
  explicit Events(size_t n) : events(n) {
    for (cudaEvent_t& e : events) CUDA(cudaEventCreate(&e));
  }
  ~Events() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

inline float elapsed_us(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms * 1000.0f;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

inline std::int64_t free_device_bytes() {
  size_t free = 0, total = 0;
  CUDA(cudaMemGetInfo(&free, &total));
  return static_cast<std::int64_t>(free);
}

// Random BF16 values in [-scale, scale) (truncated FP32), deterministic: every rank builds the
// same full weights and takes its own rows.
inline std::vector<std::uint16_t> random_bf16(std::int64_t count, float scale, std::uint32_t seed) {
  std::vector<std::uint16_t> out(static_cast<size_t>(count));
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : out) {
    x = x * 1664525u + 1013904223u;
    const float f = scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<std::uint16_t>(bits >> 16);
  }
  return out;
}

// The GEMMs of one layer with weight W [out, in] (row-major), in cuBLAS's column-major terms.
class Gemms {
 public:
  Gemms(cublasHandle_t handle, std::int64_t m) : h_(handle), m_(static_cast<int>(m)) {}
  // Y[M,out] = X[M,in] W^T
  void forward(const void* w, const void* x, void* y, const LayerShape& s) const {
    const float one = 1, zero = 0;
    CUBLAS(cublasGemmEx(h_, CUBLAS_OP_T, CUBLAS_OP_N, int(s.out_features), m_, int(s.in_features), &one, w, CUDA_R_16BF,
                        int(s.in_features), x, CUDA_R_16BF, int(s.in_features), &zero, y, CUDA_R_16BF,
                        int(s.out_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // dX[M,in] = dY[M,out] W
  void dgrad(const void* w, const void* dy, void* dx, const LayerShape& s) const {
    const float one = 1, zero = 0;
    CUBLAS(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_N, int(s.in_features), m_, int(s.out_features), &one, w, CUDA_R_16BF,
                        int(s.in_features), dy, CUDA_R_16BF, int(s.out_features), &zero, dx, CUDA_R_16BF,
                        int(s.in_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // dW[out,in] = dY^T X (beta = 0) into a grad buffer that holds garbage (overwrite), else
  // dW += dY^T X (beta = 1), FP32 accumulation.
  void wgrad(const void* x, const void* dy, GradTarget dw, const LayerShape& s) const {
    const float one = 1, beta = dw.overwrite ? 0.0f : 1.0f;
    CUBLAS(cublasGemmEx(h_, CUBLAS_OP_N, CUBLAS_OP_T, int(s.in_features), int(s.out_features), m_, &one, x, CUDA_R_16BF,
                        int(s.in_features), dy, CUDA_R_16BF, int(s.out_features), &beta, dw.data, CUDA_R_32F,
                        int(s.in_features), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

 private:
  cublasHandle_t h_;
  int m_;
};

// Median time of `run` on `stream` (3 warm-ups, 10 timed), in seconds.
template <typename Run>
double time_on(cudaStream_t stream, Run&& run) {
  Events ev(22);
  for (int i = 0; i < 3; ++i) run();
  for (int i = 0; i < 10; ++i) {
    CUDA(cudaEventRecord(ev.events[2 * i], stream));
    run();
    CUDA(cudaEventRecord(ev.events[2 * i + 1], stream));
  }
  CUDA(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int i = 0; i < 10; ++i) t.push_back(elapsed_us(ev.events[2 * i], ev.events[2 * i + 1]) * 1e-6);
  return median(t);
}

// Activations and gradients of the chain, shared by every configuration.
struct Activations {
  std::vector<std::unique_ptr<DeviceBuffer>> x;  // x[i]: layer i's input [M, in_i]; x[L]: the output
  std::unique_ptr<DeviceBuffer> dy_out;          // loss gradient [M, out_{L-1}]
  std::unique_ptr<DeviceBuffer> dx[2];           // ping-pong dgrads [M, max(N, K)]
};

inline Activations make_activations(const Options& o, std::int64_t m) {
  Activations a;
  const std::int64_t widest = std::max(o.n, o.k);
  const std::vector<std::uint16_t> host = random_bf16(m * widest, 1.0f, 7);
  for (int i = 0; i <= o.layers; ++i) {
    const std::int64_t width = i < o.layers ? layer_shape(o, i).in_features : layer_shape(o, o.layers - 1).out_features;
    a.x.push_back(std::make_unique<DeviceBuffer>(m * width * 2));
    CUDA(cudaMemcpy(a.x.back()->ptr, host.data(), static_cast<size_t>(m * width * 2), cudaMemcpyHostToDevice));
  }
  const std::int64_t out = layer_shape(o, o.layers - 1).out_features;
  a.dy_out = std::make_unique<DeviceBuffer>(m * out * 2);
  CUDA(cudaMemcpy(a.dy_out->ptr, host.data(), static_cast<size_t>(m * out * 2), cudaMemcpyHostToDevice));
  for (auto& d : a.dx) d = std::make_unique<DeviceBuffer>(m * widest * 2);
  return a;
}

class Resident : public WeightSource {
 public:
  Resident(const Options& o, const std::vector<std::uint16_t>& host_weight) {
    for (int i = 0; i < o.layers; ++i) {
      const std::int64_t elements = o.n * o.k;
      weights_.push_back(std::make_unique<DeviceBuffer>(elements * 2));
      CUDA(cudaMemcpy(weights_.back()->ptr, host_weight.data(), static_cast<size_t>(elements * 2),
                      cudaMemcpyHostToDevice));
      grads_.push_back(std::make_unique<DeviceBuffer>(elements * 4));
      CUDA(cudaMemset(grads_.back()->ptr, 0, static_cast<size_t>(elements * 4)));
    }
  }
  const void* acquire(int layer, gtp_phase_t) override { return weights_[layer]->ptr; }
  void release(int) override {}
  GradTarget grad(int layer) override { return GradTarget{grads_[layer]->as<float>(), false}; }  // accumulates
  void finalize(int, bool) override {}
  void end_step() override {}

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> weights_, grads_;
};

// Per-step results, in microseconds (medians over the timed steps).
struct StepTimes {
  double step = 0, step_min = 0, step_max = 0;
  double exposed_materialize = 0, exposed_grad_buffer = 0, exposed_drain = 0;
  double host_per_step = 0;
  std::int64_t peak_bytes = 0;  // cudaMemGetInfo: free before the configuration minus the least free seen
};

// The chain on the device: cuBLAS GEMMs on `stream`; each mark records the next event of a timed
// step (none during warm-up).
class DeviceOps : public ChainOps {
 public:
  DeviceOps(const Options& o, const Gemms& gemms, Activations& a, cudaStream_t stream)
      : o_(o), gemms_(gemms), a_(a), stream_(stream) {}
  void start_step(cudaEvent_t* events) { next_ = events; }
  void mark() override {
    if (next_ != nullptr) CUDA(cudaEventRecord(*next_++, stream_));
  }
  void forward(int layer, const void* w) override {
    gemms_.forward(w, a_.x[layer]->ptr, a_.x[layer + 1]->ptr, shape(layer));
  }
  void dgrad(int layer, const void* w) override { gemms_.dgrad(w, dy(layer), a_.dx[layer % 2]->ptr, shape(layer)); }
  void wgrad(int layer, GradTarget grad) override { gemms_.wgrad(a_.x[layer]->ptr, dy(layer), grad, shape(layer)); }

 private:
  LayerShape shape(int layer) const { return layer_shape(o_, layer); }
  // The gradient reaching layer i's output: the loss gradient, or layer i+1's dgrad.
  const void* dy(int layer) const { return layer == o_.layers - 1 ? a_.dy_out->ptr : a_.dx[(layer + 1) % 2]->ptr; }

  const Options& o_;
  const Gemms& gemms_;
  Activations& a_;
  cudaStream_t stream_;
  cudaEvent_t* next_ = nullptr;
};

// Runs warm-up then timed steps of the chain (run_step) on `stream`, one sync of `stream` at the end.
// `watch_memory` false: no cudaMemGetInfo between steps (peak_bytes is then not measured).
inline StepTimes run_steps(const Options& o, const Gemms& gemms, Activations& a, WeightSource& weights, cudaStream_t stream,
                    std::int64_t free_before, std::int64_t& least_free, bool watch_memory = true) {
  const size_t per_step = marks_per_step(o.layers, o.microbatches);
  Events ev(per_step * static_cast<size_t>(o.iters));
  DeviceOps ops(o, gemms, a, stream);
  auto host_timed = std::chrono::steady_clock::now();
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    if (it == o.warmup) host_timed = std::chrono::steady_clock::now();
    if (it > 0) weights.between_steps();  // before the step's first mark: not timed
    ops.start_step(it >= o.warmup ? &ev.events[per_step * static_cast<size_t>(it - o.warmup)] : nullptr);
    run_step(o.layers, o.microbatches, weights, ops);
    if (watch_memory) least_free = std::min(least_free, free_device_bytes());
  }
  const auto host_end = std::chrono::steady_clock::now();
  CUDA(cudaStreamSynchronize(stream));
  std::vector<double> step, mat, grad, drain;
  for (int it = 0; it < o.iters; ++it) {
    const cudaEvent_t* e = &ev.events[per_step * static_cast<size_t>(it)];
    const StepSplit sp =
        split_step(o.layers, o.microbatches, [&](size_t x, size_t y) { return elapsed_us(e[x], e[y]); });
    step.push_back(sp.step);
    mat.push_back(sp.materialize);
    grad.push_back(sp.grad_buffer);
    drain.push_back(sp.end_step);
  }
  StepTimes t;
  t.step = median(step);
  t.step_min = *std::min_element(step.begin(), step.end());
  t.step_max = *std::max_element(step.begin(), step.end());
  t.exposed_materialize = median(mat);
  t.exposed_grad_buffer = median(grad);
  t.exposed_drain = median(drain);
  t.host_per_step = std::chrono::duration<double, std::micro>(host_end - host_timed).count() / o.iters;
  t.peak_bytes = free_before - least_free;
  return t;
}

inline json step_json(const StepTimes& t) {
  const double exposed = t.exposed_materialize + t.exposed_grad_buffer + t.exposed_drain;
  return {{"step_us", {{"median", t.step}, {"min", t.step_min}, {"max", t.step_max}}},
          {"exposed_us",
           {{"materialize", t.exposed_materialize},
            {"grad_buffer", t.exposed_grad_buffer},
            {"drain", t.exposed_drain},
            {"total", exposed}}},
          {"exposed_pct_of_step", t.step > 0 ? 100.0 * exposed / t.step : 0.0},
          {"host_enqueue_us_per_step", t.host_per_step},
          {"peak_memory_bytes", t.peak_bytes}};
}


}  // namespace gtp::bench::overlap

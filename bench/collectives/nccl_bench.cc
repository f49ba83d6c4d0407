#include "bench/collectives/nccl_bench.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

#include "bench/collectives/wire_bench.h"
#include "comm/errors.h"
#include "comm/nccl.h"
#include "comm/streams.h"
#include "kernels/cuda_kernels.h"

namespace gtp::bench {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw comm::CommError(std::string(what) + ": " + cudaGetErrorString(error), false);
}

// Device memory freed on every path out.
struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    check_cuda(cudaMalloc(&data, bytes > 0 ? bytes : 1), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Stream {
  cudaStream_t handle = nullptr;
  Stream() { check_cuda(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { cudaStreamDestroy(handle); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Event {
  cudaEvent_t handle = nullptr;
  Event() { check_cuda(cudaEventCreate(&handle), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(handle); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Waits for `event` without blocking forever: a peer that died leaves NCCL kernels spinning, which
// the communicator's async error (or the timeout) reveals.
void wait_event(cudaEvent_t event, comm::NcclComm& comm, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) check_cuda(state, "cudaEventQuery");
    comm.check_async_error();
    if (Clock::now() >= deadline) {
      comm.abort();
      throw comm::CommError("gtp-bench: the GPU collective did not finish within the timeout; aborted", true);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Mean time per iteration of `body` over `iters` iterations on `stream`, by CUDA events.
template <typename Body>
double timed_us(const Body& body, int iters, cudaStream_t stream, Event& start, Event& stop, comm::NcclComm& comm,
                std::chrono::milliseconds timeout) {
  check_cuda(cudaEventRecord(start.handle, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) body();
  check_cuda(cudaEventRecord(stop.handle, stream), "cudaEventRecord");
  wait_event(stop.handle, comm, timeout);
  float elapsed_ms = 0;
  check_cuda(cudaEventElapsedTime(&elapsed_ms, start.handle, stop.handle), "cudaEventElapsedTime");
  return elapsed_ms * 1e3 / iters;
}

// The "gtp_wire" row of one size: pack, one all-gather of the chunks, unpack, all on `stream`.
BenchRow run_wire(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point,
                  comm::NcclComm& comm, cudaStream_t stream, std::chrono::milliseconds timeout,
                  double bf16_gather_us) {
  const int n = comm.size();
  const kernels::WireSpec spec = wire_spec(options);
  const kernels::ChunkLayout layout = wire_layout(options, point);
  const std::vector<unsigned char> host_shard = make_input(options, point, comm.rank());
  DeviceBuffer shard(host_shard.size()), chunk(layout.chunk_bytes), gathered(layout.chunk_bytes * n),
      weight(point.size);
  check_cuda(cudaMemcpy(shard.data, host_shard.data(), host_shard.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  kernels::PackArgs args;
  args.shard = shard.data;
  args.src_dtype = kernels::SourceDtype::kBF16;
  args.shard_rows = args.valid_rows = static_cast<int64_t>(point.per_rank_count / kWireCols);
  args.cols = kWireCols;
  args.chunk = chunk.data;
  args.chunk_capacity = layout.chunk_bytes;
  const kernels::GatheredChunks in{gathered.data, layout.chunk_bytes * n, wire_geometry(options, point, n)};
  const auto pack = [&] { kernels::pack_cuda(spec, args, stream); };
  const auto gather = [&] {
    const ncclResult_t result =
        ncclAllGather(chunk.data, gathered.data, layout.chunk_bytes, ncclUint8, comm.get(), stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      throw comm::CommError(std::string("gtp-bench: ncclAllGather failed: ") + ncclGetErrorString(result), false);
    }
    comm.wait_enqueued(timeout);
  };
  const auto unpack = [&] {
    kernels::unpack_cuda(spec, in, weight.data, static_cast<int64_t>(point.size), stream);
  };
  const auto e2e = [&] {
    pack();
    gather();
    unpack();
  };
  Event start, stop;
  for (int i = 0; i < options.warmup; ++i) e2e();
  check_cuda(cudaEventRecord(stop.handle, stream), "cudaEventRecord");
  wait_event(stop.handle, comm, timeout);
  WireTimes times;
  times.pack_us = timed_us(pack, options.iters, stream, start, stop, comm, timeout);
  bootstrap.barrier();
  times.gather_us = timed_us(gather, options.iters, stream, start, stop, comm, timeout);
  times.unpack_us = timed_us(unpack, options.iters, stream, start, stop, comm, timeout);
  bootstrap.barrier();
  times.e2e_us = timed_us(e2e, options.iters, stream, start, stop, comm, timeout);
  long long wrong = -1;
  if (options.check) {  // a fresh iteration with every buffer cleared, against the CPU reference
    check_cuda(cudaMemsetAsync(chunk.data, 0, layout.chunk_bytes, stream), "cudaMemsetAsync");
    check_cuda(cudaMemsetAsync(gathered.data, 0, layout.chunk_bytes * n, stream), "cudaMemsetAsync");
    check_cuda(cudaMemsetAsync(weight.data, 0, point.size, stream), "cudaMemsetAsync");
    e2e();
    check_cuda(cudaEventRecord(stop.handle, stream), "cudaEventRecord");
    wait_event(stop.handle, comm, timeout);
    std::vector<std::uint16_t> got(point.count);
    check_cuda(cudaMemcpy(got.data(), weight.data, point.size, cudaMemcpyDeviceToHost), "cudaMemcpy");
    wrong = count_mismatches(got, reference_weight(options, point, n));
  }
  return summarize_wire(bootstrap, options, point, times, wrong, "gtp_wire", n, bf16_gather_us);
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::vector<BenchRow> run_nccl_bench(comm::Bootstrap& bootstrap, const BenchOptions& options, int device,
                                     std::chrono::milliseconds timeout, const BenchGroups& groups) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  comm::NcclGroupConfig config;
  config.comm_name = "gtp-bench";
  comm::NcclComm job = comm::NcclComm::create_world(bootstrap, timeout, config);
  comm::NcclComm split;
  if (groups.name != "world") split = job.split(groups.groups, config, timeout);
  comm::NcclComm& group = groups.name != "world" ? split : job;  // the communicator of this rank's group
  const int n = group.size();
  const int rank = group.rank();
  const bool gather = options.collective == Collective::kAllGather;
  const ncclDataType_t type = options.type == comm::HostDataType::kFloat32 ? ncclFloat32 : ncclBfloat16;
  const ncclRedOp_t op = options.op == comm::HostReduceOp::kSum ? ncclSum : ncclAvg;
  // NCCL's reduction of BF16 inputs may round every partial sum to BF16.
  const double epsilon = std::ldexp(1.0, options.type == comm::HostDataType::kFloat32 ? -23 : -8);

  comm::StreamPool streams(device);
  comm::EventPool events(device);
  events.reserve(4);
  cudaStream_t side = streams.get("gtp-bench", gather ? comm::StreamRole::kAllGatherForward
                                                      : comm::StreamRole::kReduceScatterBackward);
  Stream raw_stream, consumer;
  Event start, stop;

  const std::vector<SweepPoint> points = sweep(options, n);
  std::size_t largest = 0;
  for (const SweepPoint& point : points) largest = std::max(largest, point.size);
  DeviceBuffer input(largest), output(largest);

  std::vector<BenchRow> rows;
  for (const SweepPoint& point : points) {
    const std::vector<unsigned char> host_input = make_input(options, point, rank);
    const std::size_t output_bytes = gather ? point.size : point.per_rank_count * type_size(options.type);
    check_cuda(cudaMemcpy(input.data, host_input.data(), host_input.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    auto issue = [&](cudaStream_t stream) {
      const ncclResult_t result =
          gather ? ncclAllGather(input.data, output.data, point.per_rank_count, type, group.get(), stream)
                 : ncclReduceScatter(input.data, output.data, point.per_rank_count, type, op, group.get(), stream);
      if (result != ncclSuccess && result != ncclInProgress) {
        throw comm::CommError(std::string("gtp-bench: NCCL collective failed: ") + ncclGetErrorString(result), false);
      }
      group.wait_enqueued(timeout);
    };
    for (const bool raw : {true, false}) {
      cudaStream_t timed = raw ? raw_stream.handle : consumer.handle;
      auto run_once = [&] {
        if (raw) {
          issue(raw_stream.handle);
        } else {
          comm::run_ordered(events, consumer.handle, side, consumer.handle, issue);
        }
      };
      for (int i = 0; i < options.warmup; ++i) run_once();
      check_cuda(cudaEventRecord(stop.handle, timed), "cudaEventRecord");
      wait_event(stop.handle, group, timeout);
      bootstrap.barrier();
      check_cuda(cudaEventRecord(start.handle, timed), "cudaEventRecord");
      for (int i = 0; i < options.iters; ++i) run_once();
      check_cuda(cudaEventRecord(stop.handle, timed), "cudaEventRecord");
      wait_event(stop.handle, group, timeout);
      float elapsed_ms = 0;
      check_cuda(cudaEventElapsedTime(&elapsed_ms, start.handle, stop.handle), "cudaEventElapsedTime");

      long long wrong = -1;
      if (options.check) {
        // A fresh, checked iteration on a cleared output: stale results cannot pass.
        check_cuda(cudaMemsetAsync(output.data, 0, output_bytes, timed), "cudaMemsetAsync");
        run_once();
        check_cuda(cudaEventRecord(stop.handle, timed), "cudaEventRecord");
        wait_event(stop.handle, group, timeout);
        std::vector<unsigned char> host_output(output_bytes);
        check_cuda(cudaMemcpy(host_output.data(), output.data, output_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        wrong = count_wrong(host_output, options, point, rank, n, epsilon);
      }
      rows.push_back(summarize(bootstrap, options, point, elapsed_ms * 1e3 / options.iters, wrong,
                               raw ? "nccl" : "gtp_stream", n));
    }
    if (options.format) {
      const double bf16_gather_us = rows[rows.size() - 2].time_us;  // this size's "nccl" row
      rows.push_back(run_wire(bootstrap, options, point, group, raw_stream.handle, timeout, bf16_gather_us));
    }
  }
  group.check_async_error();
  return rows;
}

}  // namespace gtp::bench

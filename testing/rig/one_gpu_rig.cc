#include "testing/rig/one_gpu_rig.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "testing/rig/one_gpu_rig_kernels.h"

namespace gtp::remat {
namespace {

// Before any CUDA context exists (static initializers of this test-only library):
// - Streams that share one of the device's hardware queues run in submission order, so a rank's
//   stream waiting for a peer could hold back, in the same queue, the very work of that peer it
//   waits for. 32 queues (CUDA's largest setting, default 8) give each rank's streams their own at
//   G <= 8 with three streams a rank. A value the user set is kept.
// - With lazy module loading (CUDA's default), the first launch of a kernel may synchronize the
//   context: a rank launching a kernel for the first time would wait for a peer's stream that waits
//   for that rank. Every module is loaded when the context is created instead (forced).
const bool kQueuesSet = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0) == 0;
const bool kEagerSet = setenv("CUDA_MODULE_LOADING", "EAGER", 1) == 0;

void check(cudaError_t error, const std::string& what) {
  if (error != cudaSuccess) throw std::runtime_error("one-GPU rig: " + what + " failed: " + cudaGetErrorString(error));
}

using MemOp = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// cuStreamWriteValue32 / cuStreamWaitValue32 from the driver (cudart is linked statically; libcuda is
// not linked), or null when this driver lacks them.
MemOp driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<MemOp>(fn);
}

std::vector<std::vector<std::vector<int>>> checked_groups(int world, std::vector<std::vector<std::vector<int>>> groups) {
  if (world < 1) throw std::invalid_argument("OneGpuRig: world = " + std::to_string(world) + "; give 1 or more ranks");
  if (groups.empty()) {
    std::vector<int> all(world);
    for (int r = 0; r < world; ++r) all[r] = r;
    groups.push_back({all});
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<int> seen(world, 0);
    for (const auto& part : groups[g]) {
      for (int r : part) {
        if (r < 0 || r >= world || seen[r]++ != 0) {
          throw std::invalid_argument("OneGpuRig: group " + std::to_string(g) + " names rank " + std::to_string(r) +
                                      " twice or outside 0.." + std::to_string(world - 1));
        }
      }
    }
    if (std::count(seen.begin(), seen.end(), 1) != world) {
      throw std::invalid_argument("OneGpuRig: group " + std::to_string(g) + " leaves a rank out; partition all " +
                                  std::to_string(world) + " ranks");
    }
  }
  return groups;
}

}  // namespace

struct OneGpuRig::State {
  int device = 0;
  bool memops = false;
  bool memops_progress = false;  // stream writes reach the mapped progress words (probed)
  long long timeout_ns = 0;
  std::vector<Comm> comms;
  std::vector<std::vector<int>> comm_of;  // [world rank][2 * group + (reduce-scatter ? 1 : 0)]
  std::vector<std::vector<int>> rank_in;  // [world rank][group]: the group rank
  std::vector<char> handed_out;  // char: ranks' threads may ask at once
  void* memory = nullptr;
  rig::TimeoutReport* report = nullptr;  // mapped host memory
  rig::TimeoutReport* report_device = nullptr;
  MemOp write = nullptr, wait = nullptr;
  int group_count = 0;
  void* arena = nullptr;  // world x arena_bytes of device memory, the transports' allocations
  std::int64_t arena_bytes = 0;
  // Per (world rank, communicator): collectives issued (host) and completed (device, mapped memory).
  std::unique_ptr<std::atomic<std::uint32_t>[]> issued;
  std::uint32_t* progress = nullptr;
  std::uint32_t* progress_device = nullptr;
  // Per (world rank, communicator), kernel flags only: collectives whose departure round ran, counted
  // on the device (mapped memory), replays of captured ones included.
  std::uint32_t* executed = nullptr;
  std::uint32_t* executed_device = nullptr;
  bool trace = false;  // GTP_RIG_TRACE set: every collective issued is printed (stderr)
  // Flags::kHostRendezvous, per communicator: each collective's two rounds, the event every group
  // rank recorded for it (by sequence number). Events live until the rig does: a peer may still be
  // about to wait on one when its owner moves on.
  bool host = false;
  struct HostRound {
    std::vector<cudaEvent_t> events;  // [group rank]
    int recorded = 0;
  };
  struct HostComm {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::pair<std::uint32_t, int>, HostRound> rounds;  // (sequence, round)
  };
  std::vector<std::unique_ptr<HostComm>> host_comms;
  // graph_barrier: the ranks arrived in the current generation.
  std::mutex barrier_mutex;
  std::condition_variable barrier_changed;
  std::vector<char> barrier_arrived;
  int barrier_count = 0;
  std::uint64_t barrier_generation = 0;
};

namespace {

// OneGpuRig::graph_barrier (one_gpu_rig.h says why).
void graph_barrier(OneGpuRig::State& s, int rank) {
  const int world = static_cast<int>(s.rank_in.size());
  std::unique_lock<std::mutex> lock(s.barrier_mutex);
  if (s.barrier_arrived.empty()) s.barrier_arrived.assign(world, 0);
  if (s.barrier_arrived[rank] != 0) {
    throw std::logic_error("one-GPU rig: rank " + std::to_string(rank) + " entered the graph barrier twice");
  }
  const std::uint64_t generation = s.barrier_generation;
  s.barrier_arrived[rank] = 1;
  if (++s.barrier_count == world) {
    s.barrier_count = 0;
    std::fill(s.barrier_arrived.begin(), s.barrier_arrived.end(), 0);
    ++s.barrier_generation;
    s.barrier_changed.notify_all();
    return;
  }
  if (s.barrier_changed.wait_for(lock, std::chrono::nanoseconds(s.timeout_ns),
                                 [&] { return s.barrier_generation != generation; })) {
    return;
  }
  std::string missing;
  for (int r = 0; r < world; ++r) {
    if (s.barrier_arrived[r] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  s.barrier_arrived[rank] = 0;  // gone: a late peer must not count it
  --s.barrier_count;
  throw std::runtime_error("one-GPU rig: rank " + std::to_string(rank) + " waited " +
                           std::to_string(s.timeout_ns / 1000000000LL) + " s at the graph barrier for ranks " +
                           missing + " (every rank instantiates the same graphs at the same point)");
}

// Rank `me`'s collectives (one communicator per group and role).
class Transport : public DeviceCollectives {
 public:
  Transport(OneGpuRig::State& s, int me) : s_(s), me_(me), streams_(s.comms.size(), nullptr) {}

  // Bump allocation from this rank's slice of the arena the rig allocated before any rank ran: no
  // CUDA call at all, so nothing here can wait for the device (cudaMalloc / cudaFree may, and so for
  // a peer waiting for this rank). Freed memory comes back with the rig.
  void* allocate(std::int64_t bytes) override {
    const std::int64_t at = (used_ + 255) / 256 * 256;
    if (bytes < 0 || at + bytes > s_.arena_bytes) {
      throw std::runtime_error("one-GPU rig: rank " + std::to_string(me_) + "'s arena of " +
                               std::to_string(s_.arena_bytes >> 20) + " MiB cannot hold " + std::to_string(bytes) +
                               " more bytes (" + std::to_string(used_) + " used); give OneGpuRig a larger "
                               "arena_bytes_per_rank");
    }
    used_ = at + bytes;
    return static_cast<char*>(s_.arena) + me_ * s_.arena_bytes + at;
  }
  void deallocate(void*) override {}
  void around_graph_instantiate(bool) override { graph_barrier(s_, me_); }

  int group_count() const override { return s_.group_count; }
  int size(int group) const override { return static_cast<int>(comm(group, false).ranks.size()); }
  int rank(int group) const override {
    index(group, false);  // throws for an unknown group
    return s_.rank_in[me_][group];
  }

  void all_gather(cudaStream_t stream, int group, const void* send, void* recv, std::int64_t bytes) override {
    run(stream, group, false, send, [&](const OneGpuRig::Comm& c, int rank) {
      rig::all_gather(stream, c.ptrs, static_cast<int>(c.ranks.size()), recv, bytes);
      (void)rank;
    });
  }
  void all_reduce_max(cudaStream_t stream, int group, float* data, std::int64_t count) override {
    run(stream, group, false, data, [&](const OneGpuRig::Comm& c, int rank) {
      rig::all_reduce_max(stream, c.ptrs, static_cast<int>(c.ranks.size()), rank, count);
    });
  }
  void reduce_scatter_mean(cudaStream_t stream, int group, const float* send, float* recv,
                           std::int64_t count) override {
    run(stream, group, true, send, [&](const OneGpuRig::Comm& c, int rank) {
      rig::reduce_scatter_mean(stream, c.ptrs, static_cast<int>(c.ranks.size()), rank, recv, count);
    });
  }

 private:
  int index(int group, bool rs) const {
    if (group < 0 || group >= s_.group_count) {
      throw std::invalid_argument("one-GPU rig: group " + std::to_string(group) + " is not known (it has " +
                                  std::to_string(s_.group_count) + ")");
    }
    return s_.comm_of[me_][2 * group + (rs ? 1 : 0)];
  }
  const OneGpuRig::Comm& comm(int group, bool rs) const { return s_.comms[index(group, rs)]; }

  // Arrival round, the data movement, departure round: all on `stream`.
  template <typename Move>
  void run(cudaStream_t stream, int group, bool rs, const void* ptr, Move&& move) {
    const int c = index(group, rs);
    const OneGpuRig::Comm& comm = s_.comms[c];
    if (streams_[c] != nullptr && streams_[c] != stream) {
      throw std::logic_error("one-GPU rig: rank " + std::to_string(me_) + " issued a collective of group " +
                             std::to_string(group) + (rs ? " (reduce-scatters)" : " (gathers)") +
                             " on a second stream; a communicator's collectives must stay on one stream per rank");
    }
    streams_[c] = stream;
    const int rank = s_.rank_in[me_][group];
    const std::uint32_t sequence = ++s_.issued[me_ * s_.comms.size() + c];
    if (s_.trace) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      cudaStreamIsCapturing(stream, &capture);
      std::fprintf(stderr, "one-GPU rig trace: rank %d group %d %s #%u on stream %p%s\n", me_, group,
                   rs ? "reduce-scatter" : "gather", sequence, static_cast<void*>(stream),
                   capture == cudaStreamCaptureStatusActive ? " (captured)" : "");
    }
    if (s_.host) {
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
        throw std::logic_error("one-GPU rig: host-rendezvous flags cannot be captured into a CUDA graph (each "
                               "collective's order comes from events the ranks exchange as they issue it); use "
                               "kernel or stream-memory-operation flags for captures");
      }
      host_round(stream, c, comm, rank, 0, ptr, sequence);
      move(comm, rank);
      host_round(stream, c, comm, rank, 1, nullptr, sequence);
      return;
    }
    round(stream, c, comm, rank, 0, ptr, 0);
    move(comm, rank);
    round(stream, c, comm, rank, 1, nullptr, sequence);
  }

  // Flags::kHostRendezvous: this rank records an event after its part of the round (in the arrival
  // round, after a kernel that publishes its pointer), hands it to the peers through the host, waits
  // on the host until every peer has handed over its own for the same collective, and makes `stream`
  // wait for all of them. Every wait is then on work already submitted, and no kernel spins, so it
  // also runs where kernels run one at a time (compute-sanitizer).
  void host_round(cudaStream_t stream, int c, const OneGpuRig::Comm& comm, int rank, int round, const void* ptr,
                  std::uint32_t sequence) {
    const int size = static_cast<int>(comm.ranks.size());
    const std::size_t slot = me_ * s_.comms.size() + c;
    rig::host_round_kernel(stream, ptr != nullptr ? comm.ptrs + rank : nullptr, ptr,
                           round == 1 ? s_.progress_device + slot : nullptr, sequence,
                           round == 1 ? s_.executed_device + slot : nullptr);
    cudaEvent_t mine = nullptr;
    check(cudaEventCreateWithFlags(&mine, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t recorded = cudaEventRecord(mine, stream);
    OneGpuRig::State::HostComm& h = *s_.host_comms[c];
    std::vector<cudaEvent_t> peers;
    {
      std::unique_lock<std::mutex> lock(h.mutex);
      OneGpuRig::State::HostRound& r = h.rounds[{sequence, round}];
      if (r.events.empty()) r.events.assign(size, nullptr);
      r.events[rank] = mine;  // owned by the table from here on, recorded or not
      check(recorded, "cudaEventRecord");
      ++r.recorded;
      h.changed.notify_all();
      const auto limit = std::chrono::nanoseconds(s_.timeout_ns);
      if (!h.changed.wait_for(lock, limit, [&] { return r.recorded == size; })) {
        std::string missing;
        for (int q = 0; q < size; ++q) {
          if (r.events[q] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        }
        throw std::runtime_error("one-GPU rig: group rank " + std::to_string(rank) + " waited " +
                                 std::to_string(s_.timeout_ns / 1000000000LL) + " s for group ranks " + missing +
                                 (round == 0 ? " to issue" : " to finish issuing") + " collective #" +
                                 std::to_string(sequence) + " of group " + std::to_string(comm.group) +
                                 (comm.reduce_scatter ? " (reduce-scatters)" : " (gathers)"));
      }
      peers = r.events;
    }
    for (int q = 0; q < size; ++q) {
      if (q != rank) check(cudaStreamWaitEvent(stream, peers[q], 0), "cudaStreamWaitEvent");
    }
  }

  // `done` (non-zero after the departure round): written to this rank's progress word of the
  // communicator in mapped host memory once the round is through, for the watchdog's report.
  void round(cudaStream_t stream, int c, const OneGpuRig::Comm& comm, int rank, int round, const void* ptr,
             std::uint32_t done) {
    const int size = static_cast<int>(comm.ranks.size());
    std::uint32_t* progress = s_.progress_device + me_ * s_.comms.size() + c;
    if (!s_.memops) {
      rig::flag_round_kernel(stream, comm.flags, comm.ptrs, ptr != nullptr, ptr, size, rank, round, s_.timeout_ns,
                             s_.report_device, c, done != 0 ? progress : nullptr, done,
                             done != 0 ? s_.executed_device + me_ * s_.comms.size() + c : nullptr);
      return;
    }
    std::uint32_t* base = comm.flags + static_cast<std::int64_t>(round) * size * size;
    if (ptr != nullptr) {  // two 32-bit halves: 64-bit memory operations are optional on a device
      const auto value = reinterpret_cast<std::uint64_t>(ptr);
      const auto slot = reinterpret_cast<CUdeviceptr>(&comm.ptrs[rank]);
      op(s_.write(stream, slot, static_cast<cuuint32_t>(value), CU_STREAM_WRITE_VALUE_DEFAULT), "write pointer");
      op(s_.write(stream, slot + 4, static_cast<cuuint32_t>(value >> 32), CU_STREAM_WRITE_VALUE_DEFAULT), "write pointer");
    }
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      op(s_.write(stream, reinterpret_cast<CUdeviceptr>(&base[q * size + rank]), 1, CU_STREAM_WRITE_VALUE_DEFAULT),
         "raise flag");
    }
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const auto flag = reinterpret_cast<CUdeviceptr>(&base[rank * size + r]);
      op(s_.wait(stream, flag, 1, CU_STREAM_WAIT_VALUE_EQ), "wait for flag");
      op(s_.write(stream, flag, 0, CU_STREAM_WRITE_VALUE_DEFAULT), "lower flag");
    }
    if (done != 0 && s_.memops_progress) {
      op(s_.write(stream, reinterpret_cast<CUdeviceptr>(progress), done, CU_STREAM_WRITE_VALUE_DEFAULT), "progress");
    }
  }

  static void op(CUresult result, const char* what) {
    if (result != CUDA_SUCCESS) {
      throw std::runtime_error(std::string("one-GPU rig: stream memory operation (") + what + ") failed: CUresult " +
                               std::to_string(static_cast<int>(result)));
    }
  }

  OneGpuRig::State& s_;
  int me_;
  std::vector<cudaStream_t> streams_;  // per communicator: the stream its collectives go on
  std::int64_t used_ = 0;  // bytes of this rank's arena handed out
};

// Whether stream memory operations work here, captured into a graph included (the rig's flags must
// be capturable); any failure means no.
bool memops_usable(OneGpuRig::State& s, std::uint32_t* scratch) {
  if (s.write == nullptr || s.wait == nullptr) return false;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return false;
  const auto addr = reinterpret_cast<CUdeviceptr>(scratch);
  bool ok = s.write(stream, addr, 1, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS &&
            s.wait(stream, addr, 1, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS &&
            s.write(stream, addr, 0, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS &&
            cudaStreamSynchronize(stream) == cudaSuccess;
  if (ok) {
    cudaGraph_t graph = nullptr;
    ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
      const bool captured = s.write(stream, addr, 0, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS &&
                            s.wait(stream, addr, 0, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS;
      ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && captured;
      if (graph != nullptr) {
        cudaGraphExec_t exec = nullptr;
        ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, stream) == cudaSuccess &&
             cudaStreamSynchronize(stream) == cudaSuccess;
        if (exec != nullptr) cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
    }
  }
  cudaGetLastError();
  cudaStreamDestroy(stream);
  return ok;
}

}  // namespace

OneGpuRig::OneGpuRig(int device, int world, std::vector<std::vector<std::vector<int>>> groups, Flags flags,
                     std::chrono::milliseconds spin_timeout, std::int64_t arena_bytes_per_rank)
    : world_(world), state_(std::make_unique<State>()) {
  if (arena_bytes_per_rank <= 0) {
    throw std::invalid_argument("OneGpuRig: arena_bytes_per_rank = " + std::to_string(arena_bytes_per_rank) +
                                " must be positive");
  }
  groups = checked_groups(world, std::move(groups));
  State& s = *state_;
  s.device = device;
  s.timeout_ns = static_cast<long long>(spin_timeout.count()) * 1000000LL;
  s.group_count = static_cast<int>(groups.size());
  s.comm_of.assign(world, std::vector<int>(2 * groups.size()));
  s.rank_in.assign(world, std::vector<int>(groups.size()));
  s.handed_out.assign(world, 0);
  std::size_t words = 1;  // word 0: scratch for the memory-operation probe
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t p = 0; p < groups[g].size(); ++p) {
      for (bool rs : {false, true}) {
        Comm c;
        c.group = static_cast<int>(g);
        c.part = static_cast<int>(p);
        c.reduce_scatter = rs;
        c.ranks = groups[g][p];
        for (std::size_t i = 0; i < c.ranks.size(); ++i) {
          s.comm_of[c.ranks[i]][2 * g + (rs ? 1 : 0)] = static_cast<int>(s.comms.size());
          s.rank_in[c.ranks[i]][g] = static_cast<int>(i);
        }
        words += 2 * c.ranks.size() * c.ranks.size() + 2 * c.ranks.size() + 2;  // flags, pointers (8-aligned)
        s.comms.push_back(std::move(c));
      }
    }
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMalloc(&s.memory, words * sizeof(std::uint32_t)), "cudaMalloc");
  check(cudaMemset(s.memory, 0, words * sizeof(std::uint32_t)), "cudaMemset");
  check(cudaHostAlloc(reinterpret_cast<void**>(&s.report), sizeof(rig::TimeoutReport), cudaHostAllocMapped),
        "cudaHostAlloc");
  *s.report = rig::TimeoutReport{};
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s.report_device), s.report, 0), "cudaHostGetDevicePointer");
  const std::size_t slots = static_cast<std::size_t>(world) * s.comms.size();
  s.issued.reset(new std::atomic<std::uint32_t>[slots]);
  for (std::size_t i = 0; i < slots; ++i) s.issued[i] = 0;
  check(cudaHostAlloc(reinterpret_cast<void**>(&s.progress), slots * sizeof(std::uint32_t), cudaHostAllocMapped),
        "cudaHostAlloc");
  std::fill(s.progress, s.progress + slots, 0u);
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s.progress_device), s.progress, 0),
        "cudaHostGetDevicePointer");
  check(cudaHostAlloc(reinterpret_cast<void**>(&s.executed), slots * sizeof(std::uint32_t), cudaHostAllocMapped),
        "cudaHostAlloc");
  std::fill(s.executed, s.executed + slots, 0u);
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&s.executed_device), s.executed, 0),
        "cudaHostGetDevicePointer");
  s.trace = std::getenv("GTP_RIG_TRACE") != nullptr;
  s.arena_bytes = (arena_bytes_per_rank + 255) / 256 * 256;
  check(cudaMalloc(&s.arena, static_cast<std::size_t>(world) * s.arena_bytes), "cudaMalloc (the ranks' arenas)");
  auto* next = static_cast<std::uint32_t*>(s.memory);
  std::uint32_t* scratch = next++;
  for (Comm& c : s.comms) {
    const std::size_t n = c.ranks.size();
    c.flags = next;
    next += 2 * n * n;
    next += (reinterpret_cast<std::uintptr_t>(next) % 8) / 4;
    c.ptrs = reinterpret_cast<const void**>(next);
    next += 2 * n;
  }
  s.write = driver_entry("cuStreamWriteValue32");
  s.wait = driver_entry("cuStreamWaitValue32");
  s.host = flags == Flags::kHostRendezvous;
  for (std::size_t c = 0; s.host && c < s.comms.size(); ++c) s.host_comms.push_back(std::make_unique<State::HostComm>());
  s.memops = !s.host && flags != Flags::kKernels && memops_usable(s, scratch);
  if (s.memops) {  // the progress words are mapped host memory: a diagnostic, so only if it works
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
      s.memops_progress = s.write(stream, reinterpret_cast<CUdeviceptr>(s.progress_device), 0,
                                  CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS &&
                          cudaStreamSynchronize(stream) == cudaSuccess;
      cudaGetLastError();
      cudaStreamDestroy(stream);
    }
  }
  if (flags == Flags::kStreamMemOps && !s.memops) {
    throw std::runtime_error("one-GPU rig: stream memory operations (cuStreamWaitValue32) are not usable here, "
                             "captured included; use Flags::kKernels or kAuto");
  }
}

OneGpuRig::~OneGpuRig() {
  cudaFree(state_->arena);
  cudaFree(state_->memory);
  cudaFreeHost(state_->report);
  cudaFreeHost(state_->progress);
  cudaFreeHost(state_->executed);
  for (const auto& h : state_->host_comms) {
    for (const auto& [key, round] : h->rounds) {
      for (cudaEvent_t e : round.events) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  }
}

std::string OneGpuRig::progress_report() const {
  const State& s = *state_;
  std::string out;
  for (int r = 0; r < world_; ++r) {
    for (std::size_t c = 0; c < s.comms.size(); ++c) {
      const std::uint32_t issued = s.issued[r * s.comms.size() + c].load();
      if (issued == 0) continue;
      const volatile std::uint32_t* done = s.progress + r * s.comms.size() + c;
      out += "rank " + std::to_string(r) + " group " + std::to_string(s.comms[c].group) +
             (s.comms[c].reduce_scatter ? " reduce-scatter" : " gather") + ": issued " + std::to_string(issued) +
             ", completed through " + std::to_string(*done);
      if (!s.memops) {  // kernel flags and host rendezvous count on the device
        const volatile std::uint32_t* executed = s.executed + r * s.comms.size() + c;
        out += ", executed " + std::to_string(*executed) + " (graph replays included)";
      }
      out += "\n";
    }
  }
  return out;
}

std::string OneGpuRig::flags() const {
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  const char* how = state_->host ? "host rendezvous (events)" : state_->memops ? "stream memory operations" : "kernels";
  return std::string(how) + ", CUDA_DEVICE_MAX_CONNECTIONS=" +
         (queues != nullptr ? queues : "unset") + (kQueuesSet ? "" : " (not set)") +
         ", CUDA_MODULE_LOADING=" + (loading != nullptr ? loading : "unset") + (kEagerSet ? "" : " (not set)");
}

std::unique_ptr<DeviceCollectives> OneGpuRig::transport(int rank) {
  if (rank < 0 || rank >= world_ || state_->handed_out[rank]) {
    throw std::invalid_argument("OneGpuRig: transport(" + std::to_string(rank) + "): not a rank of 0.." +
                                std::to_string(world_ - 1) + ", or already handed out");
  }
  state_->handed_out[rank] = 1;
  return std::make_unique<Transport>(*state_, rank);
}

void OneGpuRig::graph_barrier(int rank) {
  if (rank < 0 || rank >= world_) {
    throw std::invalid_argument("OneGpuRig::graph_barrier(" + std::to_string(rank) + "): not a rank of 0.." +
                                std::to_string(world_ - 1));
  }
  gtp::remat::graph_barrier(*state_, rank);
}

std::string OneGpuRig::timeout_report() const {
  const rig::TimeoutReport& r = *state_->report;
  if (r.timed_out == 0) return "";
  const Comm& c = state_->comms[r.comm];
  return "one-GPU rig: group " + std::to_string(c.group) + (c.reduce_scatter ? " reduce-scatter" : " gather") +
         " communicator: group rank " + std::to_string(r.rank) + " waited past the spin timeout for rank " +
         std::to_string(r.peer) + (r.round == 0 ? " to arrive" : " to finish") +
         " (a peer that never issued the collective, or kernels that cannot run at once)";
}

}  // namespace gtp::remat

// Backend: what the remat runtime needs from a device and a transport. The runtime (registry, cache,
// chains, grads) is written once against this interface; HostBackend (host_backend.h) runs it on CPU
// memory, the CPU reference kernels and HostComm, a CUDA + NCCL backend on device memory, the CUDA
// kernels and NcclComm. See docs/remat.md.
//
// Ordering model (the shape the CUDA backend needs; no host synchronization anywhere):
// - The backend owns two side streams per group, one per Role: gathers (amax, pack, all-gather,
//   unpack) and reduce-scatters (grad zero-fill, reduce-scatter, main-grad add, grad-ready callback),
//   so a backward re-gather never queues behind a reduce-scatter. Every work call below names the side
//   stream it is enqueued on (side_stream(group, role)); work on one stream runs in call order.
// - Consumer streams are opaque `Stream` values (cudaStream_t on CUDA). `record(stream)` returns an
//   event marking all work enqueued on that stream so far; `wait(stream, event)` orders later work on
//   `stream` after it; `forget(event)` says the runtime will not wait on it again, so the backend may
//   recycle it (a pooled cudaEvent_t). Everything between streams (side or consumer) goes by events.
// - On the host backend every call completes before it returns (a batch's collectives: when the batch
//   is launched, CollectiveBatch), so streams are ignored and every event is complete when recorded;
//   the runtime still records and waits on them, so both backends follow the same protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/arguments.h"
#include "remat/divergence.h"

namespace gtp::remat {

using Stream = void*;
using Event = std::uint64_t;

// A bad argument found while work runs or is enqueued (a kernel's pack or unpack check, ranks whose
// host collectives disagree), as opposed to misuse the runtime refuses before it enqueues anything:
// the call failed part-way, so peers may be waiting for the rest (docs/reliability.md).
class WorkError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The two side streams of a group.
enum class Role { kGather = 0, kReduceScatter = 1 };
const char* to_string(Role role);  // "gather", "reduce_scatter"

// Memory accounting shared by every backend: all runtime memory goes through allocate / deallocate.
struct MemoryStats {
  std::int64_t allocations = 0;    // allocate() calls since construction
  std::int64_t bytes_in_use = 0;
  std::int64_t peak_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;

  // Counted allocation of `bytes` (> 0), aligned to kernels::kSectionAlignment. Throws
  // std::runtime_error when the memory cannot be had.
  void* allocate(std::int64_t bytes);
  // Returns memory from allocate(); `bytes` must be what was asked for.
  void deallocate(void* ptr, std::int64_t bytes);
  const MemoryStats& memory() const { return memory_; }

  // Groups are small integers chosen by whoever builds the backend (one communicator each).
  // Both throw std::invalid_argument for a group the backend does not know.
  virtual int group_size(int group) const = 0;
  virtual int group_rank(int group) const = 0;
  virtual int group_count() const = 0;

  // Side-stream work, enqueued on `stream` (one of side_stream()'s). Pointers are backend memory
  // (device memory on CUDA), except where noted.
  virtual void amax(Stream stream, const void* shard, kernels::SourceDtype dtype, std::int64_t rows,
                    std::int64_t cols, float* out) = 0;
  virtual void pack(Stream stream, const kernels::WireSpec& spec, const kernels::PackArgs& args) = 0;
  virtual void unpack(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                      void* out_bf16, std::int64_t out_capacity) = 0;
  // Several weights of one wire spec to the BF16 layout: what unpack does for each job. The default
  // calls unpack per job; the CUDA backend decodes up to kernels::kUnpackJobsPerLaunch jobs per launch.
  virtual void unpack_many(Stream stream, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs);
  // The GEMM-ready layout (kernels::unpack_gemm_*): FP8, MXFP8, NVFP4 only.
  virtual void unpack_gemm(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                           const kernels::GemmOutputs& out) = 0;
  // recv[r * bytes_per_rank ...] = group rank r's send.
  virtual void all_gather(Stream stream, int group, const void* send, void* recv, std::int64_t bytes_per_rank) = 0;
  // In place, one collective for all `count` values.
  virtual void all_reduce_max(Stream stream, int group, float* data, std::int64_t count) = 0;
  // recv = (1/G) x sum over the group of the recv_count values at offset group_rank x recv_count of
  // each rank's send (G x recv_count FP32 values), accumulated in FP32. recv may be exactly
  // send + group_rank x recv_count (in place); it must not overlap send otherwise.
  virtual void reduce_scatter_mean(Stream stream, int group, const float* send, float* recv,
                                   std::int64_t recv_count) = 0;
  // As reduce_scatter_mean, the sum instead of the mean (GradsConfig::sum). The default throws
  // std::logic_error: a backend that only averages (a test transport) says so.
  virtual void reduce_scatter_sum(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count);
  // dst[i] += src[i] in FP32.
  virtual void add(Stream stream, const float* src, float* dst, std::int64_t count) = 0;
  virtual void fill(Stream stream, void* dst, unsigned char byte, std::int64_t bytes) = 0;
  // dst[i] = src[i] in FP32 (non-overlapping). The default fills dst with zeros and adds: correct on
  // any backend; the host and CUDA backends copy in one pass.
  virtual void copy(Stream stream, const float* src, float* dst, std::int64_t count);
  // Runs `callback` on the host once all work enqueued on `stream` so far has completed.
  virtual void host_callback(Stream stream, std::function<void()> callback) = 0;
  // Collective over `group`, first in a fill's collective batch (so it lines up across ranks exactly
  // as the fill's gathers do): gathers every rank's `mine` and hands the G tags, in group-rank order,
  // to `*check`, which throws DivergenceError when they differ (docs/reliability.md). `when` says
  // where a mismatch was found (null: at the fill, as it was issued). The host backend checks at once
  // (in a graph: at each launch, with the tag it was recorded with). The CUDA backend checks on the
  // device after the batch: on a mismatch it overwrites the fill's gathered bytes with 0xFF (every
  // output then decodes to NaN) and the next call on the runtime calls `*check` (poll_fill_tags).
  // The default checks nothing.
  using FillTagCheck = std::function<void(int group, const FillTag* tags, int count, const char* when)>;
  virtual void check_fill_tags(Stream /*stream*/, int /*group*/, const FillTag& /*mine*/,
                               const FillTagCheck* /*check*/) {}

  // Ordering. side_stream throws std::invalid_argument for an unknown group.
  virtual Stream side_stream(int group, Role role) = 0;
  virtual Event record(Stream stream) = 0;
  virtual void wait(Stream stream, Event event) = 0;
  virtual void forget(Event event) = 0;
  // True while `stream` is being captured into a CUDA graph (never on the host backend). The runtime
  // uses it to fork its side stream into the capture and join it back (docs/remat.md, CUDA graphs).
  virtual bool capturing(Stream /*stream*/) { return false; }
  // Graphs of work (GroupConfig::fill_graphs): the work calls made for `stream` between begin_graph
  // and end_graph are recorded into a graph instead of running; launch_graph runs the recorded work on
  // a stream, as often as wanted, with the pointers and sizes it was recorded with. Ordering calls
  // (record, wait) stay outside graphs. supports_graphs() false: the others throw std::logic_error.
  // CUDA: a stream capture (thread-local mode) instantiated into a cudaGraphExec_t. Host: the calls
  // are kept and made again, in order, at each launch.
  using Graph = std::uint64_t;
  virtual bool supports_graphs() const { return false; }
  virtual void begin_graph(Stream stream);
  virtual Graph end_graph(Stream stream);
  // Ends a recording that failed part-way, dropping it. Never throws.
  virtual void abort_graph(Stream stream) noexcept;
  virtual void launch_graph(Graph graph, Stream stream);
  // A launched graph may still be running: it is freed once it has finished. Never throws.
  virtual void destroy_graph(Graph graph) noexcept;

  // Collective (every rank of every group calls it at the same point, before any other collective):
  // per group one collective of each kind the runtime issues, on the stream and communicator it
  // issues it on (all_reduce_max and all_gather on the gather stream, reduce_scatter_mean on the
  // reduce-scatter stream), over a few bytes, then synchronize_side_streams(). A transport that sets
  // up its connections at a communicator's first collective (NCCL) does so here, not inside a fill
  // graph or a caller's capture. The CUDA backend calls it at construction.
  void warm_up_collectives();

  // Orders later work on `waiter` after everything enqueued on `producer` so far.
  void order(Stream waiter, Stream producer);
  // Orders later work on `waiter` after everything enqueued so far on every side stream.
  void join_all(Stream waiter);

  // Collectives called while a batch is open are only recorded by the backends; launch() issues them
  // in call order (one NCCL group on the CUDA backend). Other work called meanwhile is enqueued at
  // once, so it runs before the batch's collectives on their stream (the CUDA fill-tag write relies
  // on it); anything that must follow them is called after launch().
  class CollectiveBatch {
   public:
    explicit CollectiveBatch(Backend& backend) : backend_(backend) { backend_.begin_collectives(); }
    // Issues the batch; throws what the backend's end_collectives throws (the batch is then closed).
    void launch() {
      open_ = false;
      backend_.end_collectives();
    }
    // A batch left open by an exception is cancelled (cancel_collectives): none of its collectives
    // is issued, so no peer receives part of it (docs/reliability.md, Failing ranks).
    ~CollectiveBatch();
    CollectiveBatch(const CollectiveBatch&) = delete;
    CollectiveBatch& operator=(const CollectiveBatch&) = delete;

   private:
    Backend& backend_;
    bool open_ = true;
  };

  // While a CallScope lives (the runtime opens one per public call), the backend may remember
  // per-stream state it would otherwise query on every operation: the CUDA backend reads each
  // stream's graph-capture status once. Only the user changes that state, between calls; the
  // backend itself tracks the changes it makes (a wait that forks a stream into a capture, and a
  // fill graph's recording beginning and ending).
  class CallScope {
   public:
    explicit CallScope(Backend& backend) : backend_(backend) {
      if (backend_.call_depth_ == 0) backend_.poll_fill_tags();  // may throw DivergenceError
      if (backend_.call_depth_++ == 0) backend_.begin_call();
    }
    ~CallScope() {
      if (--backend_.call_depth_ == 0) backend_.end_call();
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    Backend& backend_;
  };

  // Failing ranks (docs/reliability.md): aborts every communicator of the backend so that peers
  // waiting in a collective this rank will not make fail instead of waiting (the host transport sends
  // them `reason`; NCCL peers see it through their own deadline). Later collectives fail. Never throws.
  virtual void abort_communicators(const std::string& /*reason*/) noexcept {}
  // Whether the work before `event` (from record) has finished; the host backend's always has.
  virtual bool complete(Event /*event*/) { return true; }

 protected:
  // A fill tag mismatch the device found since the last poll: calls that check, which throws.
  virtual void poll_fill_tags() {}
  virtual void begin_collectives() {}
  virtual void end_collectives() {}
  // Closes an open batch without issuing any of its collectives. The default ends it (for a backend
  // with no batches, whose collectives ran at once).
  virtual void cancel_collectives() noexcept;
  virtual void begin_call() {}
  virtual void end_call() {}
  // Blocks the host until every side stream's work is done (warm_up_collectives only).
  virtual void synchronize_side_streams() {}
  virtual void* do_allocate(std::int64_t bytes) = 0;
  virtual void do_deallocate(void* ptr) = 0;

 private:
  MemoryStats memory_;
  int call_depth_ = 0;
};

}  // namespace gtp::remat

// CudaBackend: the remat runtime on device memory, the CUDA pack/unpack kernels and NCCL. Work goes to
// two side streams per group (gather, reduce-scatter; comm::StreamPool, priorities from
// CudaStreamPriorities), each with its own NCCL communicator (CudaGroup), and is ordered against
// consumer streams and each other with pooled events: the host never synchronizes with the device,
// except inside cudaMalloc/cudaFree, which only warm-up and teardown reach.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "comm/nccl.h"
#include "comm/streams.h"
#include "remat/backend.h"
#include "remat/device_collectives.h"
#include "remat/fill_tags_cuda.h"

namespace gtp::remat {

// Side-stream priorities (CUDA's convention: lower runs first); unset: the device's greatest priority.
// Out of the device's range: std::invalid_argument.
struct CudaStreamPriorities {
  std::optional<int> gather;
  std::optional<int> reduce_scatter;
};

// The two communicators of one group, over the same ranks in the same order (not owned; they must
// outlive the backend). NCCL runs one communicator's collectives one after another whatever their
// streams, so a re-gather would wait behind a reduce-scatter on a shared one; two let them overlap.
struct CudaGroup {
  comm::NcclComm* gather = nullptr;          // all_gather and all_reduce_max (the amax for packing)
  comm::NcclComm* reduce_scatter = nullptr;  // reduce_scatter_mean
};

// A CUDA call, kernel launch or NCCL enqueue of the CudaBackend failed (device memory exhausted, an
// invalid pointer, a sticky device error): the C ABI reports it as GTP_ERROR_CUDA. NCCL timeouts and
// asynchronous communicator errors stay comm::CommError.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CudaBackend : public Backend {
 public:
  // groups[g] holds the communicators of group g, on `device`. `timeout` bounds the wait for a
  // non-blocking communicator to enqueue a collective. Throws std::invalid_argument, naming the group,
  // for an empty list, a null or empty communicator, a reduce-scatter communicator that is also a
  // gather communicator (of any group), or one whose size or rank differs from its gather
  // communicator's; all but the last are checked before any CUDA or NCCL call. Throws CudaError when
  // CUDA fails (here and in every call). Collective: it ends with warm_up_collectives() (one
  // all-reduce max, all-gather and reduce-scatter per group, synchronized), so every rank of every
  // group constructs its backend at the same point.
  // priorities[g] sets group g's side-stream priorities; empty: every group's side streams at the
  // device's greatest priority; any other count is std::invalid_argument (before any CUDA call).
  CudaBackend(int device, std::vector<CudaGroup> groups, std::chrono::milliseconds timeout,
              std::vector<CudaStreamPriorities> priorities = {});
  // TEST ONLY: the collectives go to `collectives` (a test transport, e.g. OneGpuRig's ranks, which
  // sets the groups, sizes and ranks) instead of NCCL; everything else as above. Collective too (the
  // warm-up). std::invalid_argument for a null transport or a bad priority count.
  CudaBackend(int device, std::unique_ptr<DeviceCollectives> collectives,
              std::vector<CudaStreamPriorities> priorities = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  // As the communicators had them at construction (an aborted communicator no longer knows).
  int group_size(int group) const override { return shape(group).first; }
  int group_rank(int group) const override { return shape(group).second; }

  int group_count() const override { return static_cast<int>(groups_.size()); }

  void amax(Stream stream, const void* shard, kernels::SourceDtype dtype, std::int64_t rows, std::int64_t cols,
            float* out) override;
  void pack(Stream stream, const kernels::WireSpec& spec, const kernels::PackArgs& args) override;
  void unpack(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in, void* out_bf16,
              std::int64_t out_capacity) override;
  // One kernels::unpack_many_cuda: one launch per kernels::kUnpackJobsPerLaunch jobs.
  void unpack_many(Stream stream, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs) override;
  void unpack_gemm(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                   const kernels::GemmOutputs& out) override;
  void all_gather(Stream stream, int group, const void* send, void* recv, std::int64_t bytes_per_rank) override;
  void all_reduce_max(Stream stream, int group, float* data, std::int64_t count) override;
  void reduce_scatter_mean(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) override;
  // ncclSum on the reduce-scatter communicator; std::logic_error on a test transport (it averages only).
  void reduce_scatter_sum(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) override;
  void add(Stream stream, const float* src, float* dst, std::int64_t count) override;
  void copy(Stream stream, const float* src, float* dst, std::int64_t count) override;
  void fill(Stream stream, void* dst, unsigned char byte, std::int64_t bytes) override;
  // The callback runs on a CUDA host-function thread and must not call CUDA. Captured into a graph,
  // it runs on every replay; the backend keeps it until destruction.
  void host_callback(Stream stream, std::function<void()> callback) override;
  // Writes the tag (eagerly a 64-byte copy from a page-locked ring slot, in a capture a kernel; the
  // kernel also when the ring's next slot is still unread), gathers it inside the open batch and, once
  // the batch is enqueued, checks it on the device (fill_tags_cuda.h): on a mismatch the fill's
  // gathered bytes become 0xFF and the next runtime call throws (poll_fill_tags).
  void check_fill_tags(Stream stream, int group, const FillTag& mine, const FillTagCheck* check) override;
  // The fill-tag buffers and ring: how the tags were written (CudaFillTags::writes); benchmarks and
  // tests may turn the copy off (set_copy).
  CudaFillTags& fill_tags() { return *fill_tags_; }

  Stream side_stream(int group, Role role) override;
  Event record(Stream stream) override;
  void wait(Stream stream, Event event) override;
  // Inside a capture, a wait on an event recorded before the capture began is dropped (that work must
  // be complete when capture begins: synchronize first), and so is a wait on an event recorded by an
  // earlier, finished capture (its graph's replays are ordered by their launch stream: synchronize it
  // before going back to eager calls). See docs/remat.md, CUDA graphs.
  void forget(Event event) override;
  bool capturing(Stream stream) override;

  // A stream capture in cudaStreamCaptureModeThreadLocal (other threads keep their CUDA calls),
  // instantiated once and uploaded then, on a private idle stream the host waits for (once per
  // recording), so no launch uploads it behind the work queued on its stream; each launch is one
  // cudaGraphLaunch. Captured NCCL collectives follow NCCL's
  // rule that graph capture is a collective property (docs/remat.md, Fill graphs).
  bool supports_graphs() const override { return true; }
  void begin_graph(Stream stream) override;
  Graph end_graph(Stream stream) override;
  void abort_graph(Stream stream) noexcept override;
  void launch_graph(Graph graph, Stream stream) override;
  void destroy_graph(Graph graph) noexcept override;

  // ncclCommAbort on every group's communicators (peers learn of it through their own deadline).
  void abort_communicators(const std::string& reason) noexcept override;
  bool complete(Event event) override;  // cudaEventQuery

 protected:
  void* do_allocate(std::int64_t bytes) override;
  void do_deallocate(void* ptr) override;
  void poll_fill_tags() override;
  // A batch (Backend::CollectiveBatch) records its collectives; end_collectives issues them in one
  // ncclGroupStart / ncclGroupEnd (the test transport: in order), then the fill-tag check kernel.
  void begin_collectives() override;
  void end_collectives() override;
  // Drops the record: NCCL (or the test transport) never sees any of the batch.
  void cancel_collectives() noexcept override;
  // Within a call, each stream's capture status is read once (capture_id); the call runs with the
  // backend's device current, and the caller's device is restored at its end.
  void begin_call() override;
  void end_call() override;
  void synchronize_side_streams() override;

 private:
  // Throws std::invalid_argument for an unknown group.
  const CudaGroup& comms(int group) const;
  // The constructors' shared tail: side streams, then the warm-up collectives.
  void start(std::vector<CudaStreamPriorities> priorities);
  const std::pair<int, int>& shape(int group) const;  // (size, rank); throws for an unknown group
  void enqueued(comm::NcclComm& comm, int result, const char* what);
  // A collective as the runtime called it; recorded while a batch is open, issued at its end.
  struct Collective {
    enum class Op : unsigned char { kAllGather, kAllReduceMax, kReduceScatterMean, kReduceScatterSum };
    Op op;
    int group;
    cudaStream_t stream;
    const void* send;
    void* recv;
    std::int64_t count;  // bytes per rank (gather), floats (all-reduce), floats per rank (reduce-scatter)
  };
  void collective(const Collective& c);  // records it in an open batch, else issues it
  void issue(const Collective& c);       // to NCCL (or the test transport)
  void issue_batch();                    // the recorded collectives, in one NCCL group
  struct Live {
    cudaEvent_t event;
    cudaStream_t stream;         // where it was recorded
    unsigned long long capture;  // id of the capture it was recorded in; 0: recorded eagerly
  };
  const Live& live(Event id) const;
  // The id of the capture `stream` is part of, 0 if none; remembered within a call.
  unsigned long long capture_id(cudaStream_t stream);
  void forget_capture(cudaStream_t stream) noexcept;  // drops the memo of `stream`

  int device_;
  std::vector<CudaGroup> groups_;  // validated before streams_ and events_ touch CUDA
  std::vector<std::pair<int, int>> shapes_;  // per group: (size, this rank), from construction
  std::chrono::milliseconds timeout_;
  comm::StreamPool streams_;
  std::vector<cudaStream_t> side_;  // [2 * group + role], created in the constructor
  comm::EventPool events_;
  std::unordered_map<Event, Live> live_;
  std::vector<std::unique_ptr<std::function<void()>>> graph_callbacks_;  // captured host callbacks
  Event next_ = 0;
  bool batching_ = false;                    // a batch is open: collectives are recorded
  std::vector<Collective> batch_;            // its record (cleared, never shrunk: no allocation per batch)
  bool grouped_ = false;                     // issue_batch is inside ncclGroupStart / ncclGroupEnd
  std::vector<comm::NcclComm*> batch_comms_;  // the communicators of the group's collectives
  bool in_call_ = false;
  int caller_device_ = -1;  // the device current when the call began
  std::vector<std::pair<cudaStream_t, unsigned long long>> capture_memo_;  // within a call
  std::unordered_map<Graph, cudaGraphExec_t> graphs_;  // begin_graph / end_graph recordings
  // end_graph's uploads only, so idle but for them (docs/remat.md, Fill graphs); destroyed last.
  struct UploadStream {
    cudaStream_t stream = nullptr;
    ~UploadStream() {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  } upload_;
  Graph next_graph_ = 0;
  std::unique_ptr<CudaFillTags> fill_tags_;
  const FillTagCheck* fill_tag_check_ = nullptr;  // the runtime's, from its latest check_fill_tags
  std::unique_ptr<DeviceCollectives> collectives_;  // a test transport in NCCL's place; null: NCCL
};

// dst[i] += src[i] for count FP32 values, enqueued on `stream` (remat/add.cu).
void add_fp32_cuda(const float* src, float* dst, std::int64_t count, cudaStream_t stream);

}  // namespace gtp::remat

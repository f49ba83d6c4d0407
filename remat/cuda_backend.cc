#include "remat/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cuda_kernels.h"

namespace gtp::remat {
namespace {

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw CudaError(std::string(what) + " failed: " + cudaGetErrorString(error));
}

// The kernels report launch failures as std::runtime_error with CUDA's message; bad arguments become
// WorkError (still std::invalid_argument): the call fails part-way.
template <typename Launch>
void launch(const char* what, Launch&& body) {
  try {
    body();
  } catch (const CudaError&) {
    throw;
  } catch (const WorkError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw WorkError(e.what());
  } catch (const std::runtime_error& e) {
    throw CudaError(std::string(what) + ": " + e.what());
  }
}

cudaStream_t on(Stream stream) { return static_cast<cudaStream_t>(stream); }

// Makes `device` current for a scope, restoring the caller's device at its end.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&caller_) == cudaSuccess && caller_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (caller_ >= 0) cudaSetDevice(caller_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int caller_ = -1;
};

void run_callback(void* data) {
  std::unique_ptr<std::function<void()>> callback(static_cast<std::function<void()>*>(data));
  (*callback)();
}

// A captured host node runs on every replay, so its callback is owned by the backend, not by the run.
void run_graph_callback(void* data) { (*static_cast<std::function<void()>*>(data))(); }

// Every check but the size / rank match compares pointers only, so bad arguments are refused before
// any CUDA or NCCL call (StreamPool's constructor already queries the device).
std::vector<CudaGroup> validated(std::vector<CudaGroup> groups, std::size_t priority_sets) {
  if (groups.empty()) {
    throw std::invalid_argument("CudaBackend: no groups; pass one CudaGroup (gather and reduce-scatter NcclComm) per group");
  }
  if (priority_sets != 0 && priority_sets != groups.size()) {
    throw std::invalid_argument("CudaBackend: " + std::to_string(priority_sets) + " stream priority sets for " +
                                std::to_string(groups.size()) + " groups; pass one per group, or none for the "
                                "device's greatest priority everywhere");
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group = "CudaBackend: group " + std::to_string(g) + "'s ";
    if (groups[g].gather == nullptr || !groups[g].gather->valid()) {
      throw std::invalid_argument(group + "gather communicator is null or empty; pass a valid NcclComm");
    }
    if (groups[g].reduce_scatter == nullptr || !groups[g].reduce_scatter->valid()) {
      throw std::invalid_argument(group + "reduce-scatter communicator is null or empty; pass a second NcclComm over "
                                          "the group's ranks (split the gather communicator once more)");
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t h = 0; h < groups.size(); ++h) {
      if (groups[g].reduce_scatter->get() == groups[h].gather->get()) {
        throw std::invalid_argument("CudaBackend: group " + std::to_string(g) +
                                    "'s reduce-scatter communicator is the gather communicator of group " +
                                    std::to_string(h) + "; NCCL would serialize their collectives: give "
                                    "reduce-scatters their own communicator (split the gather communicator once more)");
      }
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const comm::NcclComm& gather = *groups[g].gather;
    const comm::NcclComm& reduce_scatter = *groups[g].reduce_scatter;
    if (reduce_scatter.size() != gather.size() || reduce_scatter.rank() != gather.rank()) {
      throw std::invalid_argument(
          "CudaBackend: group " + std::to_string(g) + "'s reduce-scatter communicator spans " +
          std::to_string(reduce_scatter.size()) + " ranks with this one at " + std::to_string(reduce_scatter.rank()) +
          ", its gather communicator " + std::to_string(gather.size()) + " ranks with this one at " +
          std::to_string(gather.rank()) + "; both must hold the group's ranks in the same order");
    }
  }
  return groups;
}

}  // namespace

CudaBackend::CudaBackend(int device, std::vector<CudaGroup> groups, std::chrono::milliseconds timeout,
                         std::vector<CudaStreamPriorities> priorities)
    : device_(device),
      groups_(validated(std::move(groups), priorities.size())),
      timeout_(timeout),
      streams_(device),
      events_(device) {
  for (const CudaGroup& g : groups_) shapes_.push_back({g.gather->size(), g.gather->rank()});
  start(std::move(priorities));
}

namespace {
// A test transport's groups: no communicators (comms() only range-checks them).
std::vector<CudaGroup> transport_groups(const DeviceCollectives* collectives, std::size_t priority_sets) {
  if (collectives == nullptr) throw std::invalid_argument("CudaBackend: the test transport is null");
  const std::size_t groups = static_cast<std::size_t>(collectives->group_count());
  if (groups == 0) throw std::invalid_argument("CudaBackend: the test transport has no groups");
  if (priority_sets != 0 && priority_sets != groups) {
    throw std::invalid_argument("CudaBackend: " + std::to_string(priority_sets) + " stream priority sets for " +
                                std::to_string(groups) + " groups; pass one per group, or none");
  }
  return std::vector<CudaGroup>(groups);
}
}  // namespace

CudaBackend::CudaBackend(int device, std::unique_ptr<DeviceCollectives> collectives,
                         std::vector<CudaStreamPriorities> priorities)
    : device_(device),
      groups_(transport_groups(collectives.get(), priorities.size())),
      timeout_(0),
      streams_(device),
      events_(device),
      collectives_(std::move(collectives)) {
  for (int g = 0; g < collectives_->group_count(); ++g) shapes_.push_back({collectives_->size(g), collectives_->rank(g)});
  start(std::move(priorities));
}

void CudaBackend::start(std::vector<CudaStreamPriorities> priorities) {
  priorities.resize(groups_.size());  // none given: the device's greatest priority everywhere
  check(cudaSetDevice(device_), "cudaSetDevice");
  // One gather stream serves every phase (StreamPool's forward-gather role names it), one stream the
  // reduce-scatters: a re-gather never waits in a stream queue behind a reduce-scatter, nor (each role
  // having its own communicator) in NCCL's.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::string name = "remat" + std::to_string(g);
    side_.push_back(streams_.get(name, comm::StreamRole::kAllGatherForward, priorities[g].gather));
    side_.push_back(streams_.get(name, comm::StreamRole::kReduceScatterBackward, priorities[g].reduce_scatter));
  }
  std::vector<int> sizes;
  for (const auto& [size, rank] : shapes_) sizes.push_back(size);
  launch("fill tag buffers", [&] { fill_tags_ = std::make_unique<CudaFillTags>(sizes); });
  // NCCL connects a communicator's peers at its first collective; that must not be inside a fill graph
  // or a caller's capture (with the BF16 wire no amax all-reduce comes before the first gather).
  warm_up_collectives();
}

void CudaBackend::synchronize_side_streams() {
  for (cudaStream_t stream : side_) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up collectives)");
}

CudaBackend::~CudaBackend() {
  const DeviceScope device(device_);
  for (auto& [id, entry] : live_) events_.release(entry.event);
  for (cudaStream_t stream : side_) cudaStreamSynchronize(stream);  // StreamPool destroys them
  for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
}

const std::pair<int, int>& CudaBackend::shape(int group) const {
  comms(group);  // throws for an unknown group
  return shapes_[static_cast<std::size_t>(group)];
}

const CudaGroup& CudaBackend::comms(int group) const {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    throw std::invalid_argument("group " + std::to_string(group) + " is not known to the CUDA backend (it has " +
                                std::to_string(groups_.size()) + " groups, 0.." +
                                std::to_string(groups_.size() - 1) + ")");
  }
  return groups_[group];
}

Stream CudaBackend::side_stream(int group, Role role) {
  comms(group);  // throws for an unknown group
  return side_[2 * group + static_cast<int>(role)];
}

void CudaBackend::enqueued(comm::NcclComm& comm, int result, const char* what) {
  if (grouped_ && result == ncclSuccess) {  // enqueued by the batch's ncclGroupEnd
    if (std::find(batch_comms_.begin(), batch_comms_.end(), &comm) == batch_comms_.end()) {
      batch_comms_.push_back(&comm);
    }
    return;
  }
  if (result == ncclInProgress) {
    comm.wait_enqueued(timeout_);
  } else if (result != ncclSuccess) {
    throw CudaError(std::string(what) + " failed: " + ncclGetErrorString(static_cast<ncclResult_t>(result)));
  }
}

void CudaBackend::amax(Stream stream, const void* shard, kernels::SourceDtype dtype, std::int64_t rows, std::int64_t cols, float* out) {
  launch("amax_cuda", [&] { kernels::amax_cuda(shard, dtype, rows, cols, out, on(stream)); });
}

void CudaBackend::pack(Stream stream, const kernels::WireSpec& spec, const kernels::PackArgs& args) {
  launch("pack_cuda", [&] { kernels::pack_cuda(spec, args, on(stream)); });
}

void CudaBackend::unpack(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in, void* out_bf16,
                         std::int64_t out_capacity) {
  launch("unpack_cuda", [&] { kernels::unpack_cuda(spec, in, out_bf16, out_capacity, on(stream)); });
}

void CudaBackend::unpack_many(Stream stream, const kernels::WireSpec& spec,
                              const std::vector<kernels::UnpackJob>& jobs) {
  launch("unpack_many_cuda", [&] {
    kernels::unpack_many_cuda(spec, jobs.data(), static_cast<std::int64_t>(jobs.size()), on(stream));
  });
}

void CudaBackend::unpack_gemm(Stream stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                              const kernels::GemmOutputs& out) {
  launch("unpack_gemm_cuda", [&] { kernels::unpack_gemm_cuda(spec, in, out, on(stream)); });
}

void CudaBackend::all_gather(Stream stream, int group, const void* send, void* recv, std::int64_t bytes_per_rank) {
  collective({Collective::Op::kAllGather, group, on(stream), send, recv, bytes_per_rank});
  CudaFillTags::Pending& fill = fill_tags_->pending;
  if (!fill.open) return;
  const std::int64_t bytes = bytes_per_rank * group_size(group);
  if (!fill.regions.empty() &&
      static_cast<char*>(fill.regions.back().ptr) + fill.regions.back().bytes == static_cast<char*>(recv)) {
    fill.regions.back().bytes += bytes;  // a key's in-place weights lie back to back in its slot
  } else {
    fill.regions.push_back({recv, bytes});
  }
}

void CudaBackend::collective(const Collective& c) {
  comms(c.group);  // throws for an unknown group, before anything is recorded
  if (batching_) {
    batch_.push_back(c);
  } else {
    issue(c);
  }
}

void CudaBackend::issue(const Collective& c) {
  const CudaGroup& g = comms(c.group);
  switch (c.op) {
    case Collective::Op::kAllGather: {
      if (collectives_ != nullptr) return collectives_->all_gather(c.stream, c.group, c.send, c.recv, c.count);
      comm::NcclComm& nccl = *g.gather;
      return enqueued(nccl, ncclAllGather(c.send, c.recv, static_cast<std::size_t>(c.count), ncclUint8, nccl.get(),
                                          c.stream),
                      "ncclAllGather");
    }
    case Collective::Op::kAllReduceMax: {
      auto* data = static_cast<float*>(c.recv);
      if (collectives_ != nullptr) return collectives_->all_reduce_max(c.stream, c.group, data, c.count);
      comm::NcclComm& nccl = *g.gather;
      return enqueued(nccl, ncclAllReduce(data, data, static_cast<std::size_t>(c.count), ncclFloat32, ncclMax,
                                          nccl.get(), c.stream),
                      "ncclAllReduce(max)");
    }
    case Collective::Op::kReduceScatterMean:
    case Collective::Op::kReduceScatterSum: {
      const auto* send = static_cast<const float*>(c.send);
      auto* recv = static_cast<float*>(c.recv);
      const bool sum = c.op == Collective::Op::kReduceScatterSum;
      if (collectives_ != nullptr) return collectives_->reduce_scatter_mean(c.stream, c.group, send, recv, c.count);
      comm::NcclComm& nccl = *g.reduce_scatter;
      // The mean over one rank is the value itself: ncclSum says so, and NCCL then leaves an in-place
      // buffer alone, where ncclAvg would run a scaling kernel over it (its one-rank path).
      const ncclRedOp_t op = sum || group_size(c.group) == 1 ? ncclSum : ncclAvg;
      return enqueued(nccl, ncclReduceScatter(send, recv, static_cast<std::size_t>(c.count), ncclFloat32, op,
                                              nccl.get(), c.stream),
                      sum ? "ncclReduceScatter(sum)" : "ncclReduceScatter(mean)");
    }
  }
}

void CudaBackend::check_fill_tags(Stream stream, int group, const FillTag& mine, const FillTagCheck* check) {
  if (!batching_) throw std::logic_error("CudaBackend::check_fill_tags outside a collective batch");
  comms(group);  // throws for an unknown group, before the tag is written
  CudaFillTags& tags = *fill_tags_;
  // Eager: copied from a page-locked ring slot; captured: the kernel, whose argument the graph keeps.
  const bool captured = capturing(stream);
  launch("fill tag write", [&] { tags.write(group, mine, on(stream), captured); });
  all_gather(stream, group, tags.send(group), tags.recv(group), static_cast<std::int64_t>(sizeof(FillTag)));
  CudaFillTags::Pending& fill = tags.pending;  // write() set its stream, group, tag and ring slot
  fill.open = true;
  fill.regions.clear();
  fill_tag_check_ = check;
}

void CudaBackend::poll_fill_tags() {
  const FillTagVerdict* verdict = fill_tags_->found();
  if (verdict == nullptr || fill_tag_check_ == nullptr) return;
  std::atomic_thread_fence(std::memory_order_acquire);  // the fields the device wrote before `found`
  const std::vector<FillTag> tags(verdict->tags, verdict->tags + verdict->count);
  (*fill_tag_check_)(verdict->group, tags.data(), verdict->count,
                     "found on the device after the gather, reported at this rank's next call");
}

void CudaBackend::all_reduce_max(Stream stream, int group, float* data, std::int64_t count) {
  collective({Collective::Op::kAllReduceMax, group, on(stream), data, data, count});
}

void CudaBackend::reduce_scatter_mean(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) {
  collective({Collective::Op::kReduceScatterMean, group, on(stream), send, recv, recv_count});
}

void CudaBackend::reduce_scatter_sum(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) {
  if (collectives_ != nullptr) {
    throw std::logic_error("CudaBackend::reduce_scatter_sum on a test transport, which reduces means only");
  }
  collective({Collective::Op::kReduceScatterSum, group, on(stream), send, recv, recv_count});
}

void CudaBackend::add(Stream stream, const float* src, float* dst, std::int64_t count) {
  launch("add_fp32_cuda", [&] { add_fp32_cuda(src, dst, count, on(stream)); });
}

void CudaBackend::copy(Stream stream, const float* src, float* dst, std::int64_t count) {
  check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(count) * sizeof(float), cudaMemcpyDeviceToDevice,
                        on(stream)),
        "cudaMemcpyAsync");
}

void CudaBackend::fill(Stream stream, void* dst, unsigned char byte, std::int64_t bytes) {
  check(cudaMemsetAsync(dst, byte, static_cast<std::size_t>(bytes), on(stream)), "cudaMemsetAsync");
}

void CudaBackend::host_callback(Stream stream, std::function<void()> callback) {
  if (capturing(stream)) {
    graph_callbacks_.push_back(std::make_unique<std::function<void()>>(std::move(callback)));
    check(cudaLaunchHostFunc(on(stream), run_graph_callback, graph_callbacks_.back().get()), "cudaLaunchHostFunc");
    return;
  }
  auto* data = new std::function<void()>(std::move(callback));
  const cudaError_t error = cudaLaunchHostFunc(on(stream), run_callback, data);
  if (error != cudaSuccess) {
    delete data;
    check(error, "cudaLaunchHostFunc");
  }
}

const CudaBackend::Live& CudaBackend::live(Event id) const {
  const auto found = live_.find(id);
  if (found == live_.end()) throw std::invalid_argument("event " + std::to_string(id) + " is not live");
  return found->second;
}

void CudaBackend::begin_collectives() {
  if (batching_) throw std::logic_error("CudaBackend: collective batches do not nest");
  fill_tags_->pending.open = false;
  batch_.clear();
  batching_ = true;
}

void CudaBackend::end_collectives() {
  batching_ = false;
  CudaFillTags::Pending& fill = fill_tags_->pending;
  const bool verify = fill.open;
  fill.open = false;
  try {
    issue_batch();
  } catch (...) {
    batch_.clear();
    fill_tags_->abandon();  // no check: the tag's ring slot (if any) is released by an event
    throw;
  }
  batch_.clear();
  if (verify) {  // after the gathers, before anything the runtime enqueues next (the unpacks)
    launch("verify_fill_tags_cuda", [&] { fill_tags_->verify(group_size(fill.group)); });  // releases the slot
  } else {
    fill_tags_->abandon();  // no-op unless a tag was written without its gather being recorded
  }
}

void CudaBackend::issue_batch() {
  if (collectives_ != nullptr) {  // the test transport: one after another, as NCCL would run them
    for (const Collective& c : batch_) issue(c);
    return;
  }
  if (batch_.empty()) return;
  const ncclResult_t start = ncclGroupStart();
  if (start != ncclSuccess) throw CudaError(std::string("ncclGroupStart failed: ") + ncclGetErrorString(start));
  grouped_ = true;
  batch_comms_.clear();
  try {
    for (const Collective& c : batch_) issue(c);
  } catch (...) {
    // NCCL refused a call of the group (an aborted communicator, a bad argument): ending the group
    // reports it again (dropped: the first error is the one thrown). NCCL may still run the calls it
    // accepted before it; the C ABI aborts the communicators on this error, which releases peers
    // (docs/reliability.md, Failing ranks).
    grouped_ = false;
    ncclGroupEnd();
    throw;
  }
  grouped_ = false;
  const ncclResult_t result = ncclGroupEnd();
  if (result == ncclInProgress) {  // non-blocking communicators: each finishes enqueueing on its own
    for (comm::NcclComm* c : batch_comms_) c->wait_enqueued(timeout_);
  } else if (result != ncclSuccess) {
    throw CudaError(std::string("ncclGroupEnd (batched collectives) failed: ") + ncclGetErrorString(result));
  }
}

void CudaBackend::begin_call() {
  in_call_ = true;
  capture_memo_.clear();
  // Never throws (CallScope's constructor): a failing switch shows in the call's first CUDA call.
  caller_device_ = -1;
  if (cudaGetDevice(&caller_device_) == cudaSuccess && caller_device_ != device_) cudaSetDevice(device_);
}

void CudaBackend::end_call() {
  in_call_ = false;
  capture_memo_.clear();
  if (caller_device_ >= 0 && caller_device_ != device_) cudaSetDevice(caller_device_);
}

void CudaBackend::cancel_collectives() noexcept {
  // Nothing of the batch reached NCCL or the test transport: dropping the record cancels it. Work
  // enqueued on a stream meanwhile (a fill's tag write) stays; it touches this rank's buffers only.
  batching_ = false;
  batch_.clear();
  fill_tags_->pending.open = false;
  fill_tags_->abandon();  // the tag copy stays on the stream: its ring slot is released by an event
}

void CudaBackend::abort_communicators(const std::string& /*reason*/) noexcept {
  if (collectives_ != nullptr) return;  // a test transport has no communicators
  for (const CudaGroup& g : groups_) {
    g.gather->abort();
    g.reduce_scatter->abort();
  }
}

bool CudaBackend::complete(Event id) {
  const cudaError_t error = cudaEventQuery(live(id).event);
  if (error == cudaErrorNotReady) return false;
  check(error, "cudaEventQuery");
  return true;
}

unsigned long long CudaBackend::capture_id(cudaStream_t stream) {
  if (in_call_) {
    for (const auto& [known, id] : capture_memo_) {
      if (known == stream) return id;
    }
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  check(cudaStreamGetCaptureInfo(stream, &status, &id), "cudaStreamGetCaptureInfo");
  if (status != cudaStreamCaptureStatusActive) id = 0;
  if (in_call_) capture_memo_.emplace_back(stream, id);
  return id;
}

bool CudaBackend::capturing(Stream stream) { return capture_id(static_cast<cudaStream_t>(stream)) != 0; }

Event CudaBackend::record(Stream stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned long long capture = capture_id(s);
  cudaEvent_t e = events_.acquire();
  const cudaError_t error = cudaEventRecord(e, s);
  if (error != cudaSuccess) {
    events_.release(e);
    check(error, "cudaEventRecord");
  }
  live_[++next_] = Live{e, s, capture};
  return next_;
}

void CudaBackend::wait(Stream stream, Event id) {
  const Live& entry = live(id);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned long long capture = capture_id(s);
  // Work from before this capture (or from another graph) cannot become a graph edge; the caller
  // synchronizes before capture begins (docs/remat.md); nothing is queried while capturing.
  if (capture != 0 && entry.capture != capture) return;
  // Recorded by a finished capture: its replays are ordered by their launch stream. (While that capture
  // is active, the wait below is what forks this stream into it.)
  if (capture == 0 && entry.capture != 0 && capture_id(entry.stream) != entry.capture) return;
  check(cudaStreamWaitEvent(s, entry.event, 0), "cudaStreamWaitEvent");
  if (capture == 0 && entry.capture != 0) {  // `s` joined that capture
    for (auto& [known, id] : capture_memo_) {
      if (known == s) id = entry.capture;
    }
  }
}

void CudaBackend::forget(Event id) {
  const auto found = live_.find(id);
  if (found == live_.end()) return;
  events_.release(found->second.event);
  live_.erase(found);
}

void CudaBackend::forget_capture(cudaStream_t stream) noexcept {
  capture_memo_.erase(std::remove_if(capture_memo_.begin(), capture_memo_.end(),
                                     [&](const auto& memo) { return memo.first == stream; }),
                      capture_memo_.end());
}

// A recording begins and ends inside one call: the memo of `s` is dropped at both ends, so nothing
// reads a stale "not capturing" during it (check_fill_tags asks) or a stale "capturing" after it (a
// wait dropped as if inside a capture: wrong data on the rig before this was so).
void CudaBackend::begin_graph(Stream stream) {
  const cudaStream_t s = on(stream);
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  forget_capture(s);
}

Backend::Graph CudaBackend::end_graph(Stream stream) {
  cudaGraph_t graph = nullptr;
  forget_capture(on(stream));
  check(cudaStreamEndCapture(on(stream), &graph), "cudaStreamEndCapture (fill graph)");
  // Uploaded now, on a stream with nothing else queued, and waited for: a graph not yet uploaded is
  // uploaded by its first launch in the launch stream's order, behind whatever waits there for a peer,
  // and on the H100 that held back graphs of other streams too (testing/rig/graph_launch_probe.cu: fills
  // recorded and launched at once stalled 1 run in 3 at G = 2 and 8, uploaded first 0 in 9).
  cudaGraphExec_t exec = nullptr;
  try {
    if (collectives_ != nullptr) collectives_->around_graph_instantiate(false);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  // The upload stream is created at the first recording, not with the backend: on the one-GPU rig
  // each stream created takes the next of the device's hardware queues in turn (docs/remat.md), and
  // an eager-only backend needs none.
  const char* what = "cudaStreamCreateWithFlags (graph uploads)";
  cudaError_t error =
      upload_.stream == nullptr ? cudaStreamCreateWithFlags(&upload_.stream, cudaStreamNonBlocking) : cudaSuccess;
  if (error == cudaSuccess) {
    cudaGraphInstantiateParams params{};
    params.flags = cudaGraphInstantiateFlagUpload;
    params.uploadStream = upload_.stream;
    what = "cudaGraphInstantiateWithParams (fill graph)";
    error = cudaGraphInstantiateWithParams(&exec, graph, &params);
  }
  if (error == cudaSuccess) {
    what = "cudaStreamSynchronize (fill graph upload)";
    error = cudaStreamSynchronize(upload_.stream);
  }
  cudaGraphDestroy(graph);
  try {
    if (collectives_ != nullptr) collectives_->around_graph_instantiate(true);  // also after a failure
  } catch (...) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    throw;
  }
  if (error != cudaSuccess) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    check(error, what);
  }
  graphs_.emplace(++next_graph_, exec);
  return next_graph_;
}

void CudaBackend::abort_graph(Stream stream) noexcept {
  forget_capture(on(stream));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(on(stream), &status) != cudaSuccess || status == cudaStreamCaptureStatusNone) return;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(on(stream), &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
}

void CudaBackend::launch_graph(Graph graph, Stream stream) {
  const auto found = graphs_.find(graph);
  if (found == graphs_.end()) throw std::invalid_argument("graph " + std::to_string(graph) + " is not live");
  check(cudaGraphLaunch(found->second, on(stream)), "cudaGraphLaunch (fill graph)");
}

void CudaBackend::destroy_graph(Graph graph) noexcept {
  const auto found = graphs_.find(graph);
  if (found == graphs_.end()) return;
  cudaGraphExecDestroy(found->second);  // freed once a launch still running has finished
  graphs_.erase(found);
}

void* CudaBackend::do_allocate(std::int64_t bytes) {
  if (collectives_ != nullptr) return collectives_->allocate(bytes);
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, static_cast<std::size_t>(bytes)), "cudaMalloc");
  return ptr;
}

void CudaBackend::do_deallocate(void* ptr) {
  if (collectives_ != nullptr) return collectives_->deallocate(ptr);
  cudaFree(ptr);
}

}  // namespace gtp::remat

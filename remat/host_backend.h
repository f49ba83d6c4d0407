// HostBackend: the remat runtime on CPU memory, the CPU reference kernels and HostComm (UCX), so
// real multi-rank training steps run without a GPU. Every call completes before it returns, except
// the collectives of an open batch, which run when it is launched.
#pragma once

#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "comm/host.h"
#include "remat/backend.h"

namespace gtp::remat {

class HostBackend : public Backend {
 public:
  // groups[g] is the communicator of group g; not owned, it must outlive the backend. Throws
  // std::invalid_argument for an empty list or a null communicator.
  explicit HostBackend(std::vector<comm::HostComm*> groups);
  ~HostBackend() override = default;

  std::string name() const override { return "host"; }
  int group_size(int group) const override { return comm(group).size(); }
  int group_rank(int group) const override { return comm(group).rank(); }

  int group_count() const override { return static_cast<int>(groups_.size()); }

  // Work runs at once, whatever the stream; the runtime still names the right side stream.
  void amax(Stream, const void* shard, kernels::SourceDtype dtype, std::int64_t rows, std::int64_t cols,
            float* out) override;
  void pack(Stream, const kernels::WireSpec& spec, const kernels::PackArgs& args) override;
  void unpack(Stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in, void* out_bf16,
              std::int64_t out_capacity) override;
  // Every job validated before any is written (kernels::unpack_many_reference).
  void unpack_many(Stream, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs) override;
  void unpack_gemm(Stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                   const kernels::GemmOutputs& out) override;
  void all_gather(Stream, int group, const void* send, void* recv, std::int64_t bytes_per_rank) override;
  void all_reduce_max(Stream, int group, float* data, std::int64_t count) override;
  void reduce_scatter_mean(Stream, int group, const float* send, float* recv, std::int64_t recv_count) override;
  void reduce_scatter_sum(Stream, int group, const float* send, float* recv, std::int64_t recv_count) override;
  void add(Stream, const float* src, float* dst, std::int64_t count) override;
  void copy(Stream, const float* src, float* dst, std::int64_t count) override;
  void fill(Stream, void* dst, unsigned char byte, std::int64_t bytes) override;
  void host_callback(Stream, std::function<void()> callback) override;
  // One all_gather of the tags, then `*check` on them, before the fill's own gathers.
  void check_fill_tags(Stream, int group, const FillTag& mine, const FillTagCheck* check) override;

  // A distinct non-null handle per (group, role), so ordering calls stay distinguishable.
  Stream side_stream(int group, Role role) override;
  Event record(Stream) override { return ++events_; }
  void wait(Stream, Event) override {}
  void forget(Event) override {}

  // Graphs keep the work calls made between begin_graph and end_graph (any stream: every call runs
  // at once here) and make them again at each launch, collectives included.
  bool supports_graphs() const override { return true; }
  void begin_graph(Stream) override;
  Graph end_graph(Stream) override;
  void abort_graph(Stream) noexcept override;
  void launch_graph(Graph graph, Stream) override;
  void destroy_graph(Graph graph) noexcept override;

  // HostComm::abort on each group's communicator: every peer throws `reason`.
  void abort_communicators(const std::string& reason) noexcept override;

 protected:
  void* do_allocate(std::int64_t bytes) override;
  void do_deallocate(void* ptr) override;
  // A batch (Backend::CollectiveBatch) records its collectives and makes them, in order, at its end;
  // a cancelled batch makes none, so peers never receive part of it.
  void begin_collectives() override;
  void end_collectives() override;
  void cancel_collectives() noexcept override;

 private:
  // A collective as the runtime called it (kept while a batch is open, made at its end).
  struct Collective {
    enum class Op : unsigned char { kAllGather, kAllReduceMax, kReduceScatterMean, kReduceScatterSum, kFillTags } op;
    comm::HostComm* comm;
    int group;
    const void* send;
    void* recv;
    std::int64_t count;  // bytes per rank (gather), floats (all-reduce), floats per rank (reduce-scatter)
    FillTag tag;                          // kFillTags: this rank's
    const FillTagCheck* check = nullptr;  // kFillTags
  };
  // Keeps `c` in an open batch; otherwise makes it (or records it into the graph being recorded).
  void collective(const Collective& c);
  static void make(const Collective& c);
  comm::HostComm& comm(int group) const;
  // Runs `work`, or keeps it for the graph being recorded.
  template <typename Work>
  void run(Work&& work) {
    if (recording_) {
      recorded_.emplace_back(std::forward<Work>(work));
    } else {
      as_work(work);
    }
  }
  // Runs `work`, reporting its argument checks as WorkError.
  template <typename Work>
  static void as_work(Work&& work) {
    try {
      work();
    } catch (const WorkError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw WorkError(e.what());
    }
  }

  std::vector<comm::HostComm*> groups_;
  std::vector<char> stream_tags_;  // 2 per group: the addresses are the side-stream handles
  Event events_ = 0;
  bool batching_ = false;
  std::vector<Collective> batch_;  // the open batch's (cleared, never shrunk)
  bool recording_ = false;
  std::vector<std::function<void()>> recorded_;
  std::map<Graph, std::vector<std::function<void()>>> graphs_;
  Graph next_graph_ = 0;
};

}  // namespace gtp::remat

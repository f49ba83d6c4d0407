#include "remat/host_backend.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/errors.h"
#include "kernels/reference.h"
#include "remat/divergence.h"

namespace gtp::remat {

HostBackend::HostBackend(std::vector<comm::HostComm*> groups)
    : groups_(std::move(groups)), stream_tags_(2 * groups_.size()) {
  if (groups_.empty()) throw std::invalid_argument("HostBackend: no groups; pass one HostComm per group");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g] == nullptr) {
      throw std::invalid_argument("HostBackend: communicator of group " + std::to_string(g) + " is null");
    }
  }
}

comm::HostComm& HostBackend::comm(int group) const {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    throw std::invalid_argument("group " + std::to_string(group) + " is not known to the host backend (it has " +
                                std::to_string(groups_.size()) + " groups, 0.." +
                                std::to_string(groups_.size() - 1) + ")");
  }
  return *groups_[group];
}

Stream HostBackend::side_stream(int group, Role role) {
  comm(group);  // throws for an unknown group
  return &stream_tags_[2 * group + static_cast<int>(role)];
}

void HostBackend::amax(Stream, const void* shard, kernels::SourceDtype dtype, std::int64_t rows, std::int64_t cols,
                       float* out) {
  run([=] { *out = kernels::amax_reference(shard, dtype, rows, cols); });
}

void HostBackend::pack(Stream, const kernels::WireSpec& spec, const kernels::PackArgs& args) {
  run([=] { kernels::pack_reference(spec, args); });
}

void HostBackend::unpack(Stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in, void* out_bf16,
                         std::int64_t out_capacity) {
  run([=] { kernels::unpack_reference(spec, in, out_bf16, out_capacity); });
}

void HostBackend::unpack_many(Stream, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs) {
  if (recording_) {  // the jobs are copied only into a recording
    run([=] { kernels::unpack_many_reference(spec, jobs.data(), static_cast<std::int64_t>(jobs.size())); });
    return;
  }
  as_work([&] { kernels::unpack_many_reference(spec, jobs.data(), static_cast<std::int64_t>(jobs.size())); });
}

void HostBackend::unpack_gemm(Stream, const kernels::WireSpec& spec, const kernels::GatheredChunks& in,
                              const kernels::GemmOutputs& out) {
  run([=] { kernels::unpack_gemm_reference(spec, in, out); });
}

void HostBackend::all_gather(Stream, int group, const void* send, void* recv, std::int64_t bytes_per_rank) {
  collective({Collective::Op::kAllGather, &comm(group), group, send, recv, bytes_per_rank, FillTag{}});
}

void HostBackend::all_reduce_max(Stream, int group, float* data, std::int64_t count) {
  collective({Collective::Op::kAllReduceMax, &comm(group), group, data, data, count, FillTag{}});
}

void HostBackend::reduce_scatter_mean(Stream, int group, const float* send, float* recv, std::int64_t recv_count) {
  collective({Collective::Op::kReduceScatterMean, &comm(group), group, send, recv, recv_count, FillTag{}});
}

void HostBackend::reduce_scatter_sum(Stream, int group, const float* send, float* recv, std::int64_t recv_count) {
  collective({Collective::Op::kReduceScatterSum, &comm(group), group, send, recv, recv_count, FillTag{}});
}

void HostBackend::add(Stream, const float* src, float* dst, std::int64_t count) {
  run([=] {
    for (std::int64_t i = 0; i < count; ++i) dst[i] += src[i];
  });
}

void HostBackend::copy(Stream, const float* src, float* dst, std::int64_t count) {
  run([=] { std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float)); });
}

void HostBackend::fill(Stream, void* dst, unsigned char byte, std::int64_t bytes) {
  run([=] { std::memset(dst, byte, static_cast<std::size_t>(bytes)); });
}

void HostBackend::host_callback(Stream, std::function<void()> callback) { run(std::move(callback)); }

void HostBackend::check_fill_tags(Stream, int group, const FillTag& mine, const FillTagCheck* check) {
  collective({Collective::Op::kFillTags, &comm(group), group, nullptr, nullptr, 0, mine, check});
}

void HostBackend::collective(const Collective& c) {
  if (batching_) {
    batch_.push_back(c);
  } else if (recording_) {
    recorded_.emplace_back([c] { make(c); });
  } else {
    as_work([&] { make(c); });
  }
}

void HostBackend::make(const Collective& c) {
  comm::HostComm& hc = *c.comm;
  switch (c.op) {
    case Collective::Op::kAllGather:
      return hc.all_gather(c.send, c.recv, static_cast<std::size_t>(c.count));
    case Collective::Op::kAllReduceMax:
      return hc.all_reduce_max(static_cast<float*>(c.recv), static_cast<std::size_t>(c.count));
    case Collective::Op::kReduceScatterMean:
    case Collective::Op::kReduceScatterSum:
      return hc.reduce_scatter(c.send, c.recv, static_cast<std::size_t>(c.count), comm::HostDataType::kFloat32,
                               c.op == Collective::Op::kReduceScatterSum ? comm::HostReduceOp::kSum
                                                                         : comm::HostReduceOp::kMean);
    case Collective::Op::kFillTags: {
      std::vector<FillTag> tags(static_cast<std::size_t>(hc.size()));
      hc.all_gather(&c.tag, tags.data(), sizeof(FillTag));
      try {
        (*c.check)(c.group, tags.data(), hc.size(), nullptr);
      } catch (const DivergenceError&) {
        // Every rank holds the same tags, so every rank throws this. A rank that threw aborts its
        // communicators (C ABI): a barrier first, so no rank's abort reaches a peer still receiving the
        // tags, which would report the abort instead of the divergence. An abort here comes from a
        // rank past the barrier, when this rank already has the tags: the divergence is still the error.
        try {
          hc.barrier();
        } catch (const comm::CommError&) {
        }
        throw;
      }
      return;
    }
  }
}

void HostBackend::begin_collectives() {
  if (batching_) throw std::logic_error("HostBackend: collective batches do not nest");
  batch_.clear();
  batching_ = true;
}

void HostBackend::end_collectives() {
  batching_ = false;
  try {  // the first that throws ends the batch
    if (recording_) {
      for (const Collective& c : batch_) recorded_.emplace_back([c] { make(c); });
    } else {
      as_work([&] {
        for (const Collective& c : batch_) make(c);
      });
    }
  } catch (...) {
    batch_.clear();
    throw;
  }
  batch_.clear();
}

void HostBackend::cancel_collectives() noexcept {
  batching_ = false;
  batch_.clear();
}

void HostBackend::begin_graph(Stream) {
  if (recording_) throw std::logic_error("HostBackend: graph recordings do not nest");
  recording_ = true;
  recorded_.clear();
}

Backend::Graph HostBackend::end_graph(Stream) {
  if (!recording_) throw std::logic_error("HostBackend: end_graph without begin_graph");
  recording_ = false;
  graphs_[++next_graph_] = std::move(recorded_);
  recorded_.clear();
  return next_graph_;
}

void HostBackend::abort_graph(Stream) noexcept {
  recording_ = false;
  recorded_.clear();
}

void HostBackend::launch_graph(Graph graph, Stream) {
  const auto found = graphs_.find(graph);
  if (found == graphs_.end()) throw std::invalid_argument("graph " + std::to_string(graph) + " is not live");
  for (const std::function<void()>& work : found->second) as_work(work);
}

void HostBackend::destroy_graph(Graph graph) noexcept { graphs_.erase(graph); }

void HostBackend::abort_communicators(const std::string& reason) noexcept {
  for (comm::HostComm* c : groups_) c->abort(reason);  // a communicator shared by two groups: once
}

void* HostBackend::do_allocate(std::int64_t bytes) {
  const std::size_t rounded = static_cast<std::size_t>(kernels::round_up(bytes, kernels::kSectionAlignment));
  void* ptr = std::aligned_alloc(static_cast<std::size_t>(kernels::kSectionAlignment), rounded);
  if (ptr == nullptr) throw std::runtime_error("host backend: out of memory allocating " + std::to_string(bytes) + " bytes");
  return ptr;
}

void HostBackend::do_deallocate(void* ptr) { std::free(ptr); }

}  // namespace gtp::remat

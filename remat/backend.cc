#include "remat/backend.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace gtp::remat {

void Backend::reduce_scatter_sum(Stream, int, const float*, float*, std::int64_t) {
  throw std::logic_error(name() + " backend: reduce_scatter_sum is not supported (it reduces means only); "
                         "use the host or CUDA backend for sum_grads");
}

void* Backend::allocate(std::int64_t bytes) {
  if (bytes <= 0) throw std::invalid_argument("allocate: bytes = " + std::to_string(bytes) + " must be positive");
  void* ptr = do_allocate(bytes);
  ++memory_.allocations;
  memory_.bytes_in_use += bytes;
  memory_.peak_bytes = std::max(memory_.peak_bytes, memory_.bytes_in_use);
  return ptr;
}

void Backend::deallocate(void* ptr, std::int64_t bytes) {
  if (ptr == nullptr) return;
  do_deallocate(ptr);
  memory_.bytes_in_use -= bytes;
}

void Backend::unpack_many(Stream stream, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs) {
  for (const kernels::UnpackJob& job : jobs) unpack(stream, spec, job.in, job.out_bf16, job.out_capacity);
}

namespace {
[[noreturn]] void no_graphs(const Backend& backend) {
  throw std::logic_error("the " + backend.name() + " backend does not record graphs (supports_graphs() is false)");
}
}  // namespace

void Backend::copy(Stream stream, const float* src, float* dst, std::int64_t count) {
  fill(stream, dst, 0, count * static_cast<std::int64_t>(sizeof(float)));
  add(stream, src, dst, count);
}

void Backend::begin_graph(Stream) { no_graphs(*this); }
Backend::Graph Backend::end_graph(Stream) { no_graphs(*this); }
void Backend::abort_graph(Stream) noexcept {}
void Backend::launch_graph(Graph, Stream) { no_graphs(*this); }
void Backend::destroy_graph(Graph) noexcept {}

const char* to_string(Role role) {
  return role == Role::kGather ? "gather" : "reduce_scatter";
}

void Backend::join_all(Stream waiter) {
  for (int g = 0; g < group_count(); ++g) {
    for (Role role : {Role::kGather, Role::kReduceScatter}) {
      if (side_stream(g, role) != waiter) order(waiter, side_stream(g, role));
    }
  }
}

Backend::CollectiveBatch::~CollectiveBatch() {
  if (open_) backend_.cancel_collectives();  // only reached while an earlier error unwinds
}

void Backend::cancel_collectives() noexcept {
  try {
    end_collectives();
  } catch (...) {  // the error being unwound is the one reported
  }
}

void Backend::warm_up_collectives() {
  // Per group and role its own zeroed floats (one per rank), so the two streams never share a byte.
  std::vector<std::int64_t> offsets;
  std::int64_t floats = 0;
  for (int g = 0; g < group_count(); ++g) {
    offsets.push_back(floats);
    floats += 2 * group_size(g);
  }
  const std::int64_t bytes = floats * static_cast<std::int64_t>(sizeof(float));
  auto* scratch = static_cast<float*>(allocate(bytes));
  try {
    for (int g = 0; g < group_count(); ++g) {
      float* gathered = scratch + offsets[g];
      float* reduced = gathered + group_size(g);
      const Stream gather = side_stream(g, Role::kGather);
      const Stream rs = side_stream(g, Role::kReduceScatter);
      fill(gather, gathered, 0, group_size(g) * static_cast<std::int64_t>(sizeof(float)));
      all_reduce_max(gather, g, gathered, 1);
      all_gather(gather, g, gathered + group_rank(g), gathered, sizeof(float));  // in place
      fill(rs, reduced, 0, group_size(g) * static_cast<std::int64_t>(sizeof(float)));
      reduce_scatter_mean(rs, g, reduced, reduced + group_rank(g), 1);  // in place
    }
    synchronize_side_streams();
  } catch (...) {
    try {  // the first error is the one reported; the scratch is freed once nothing reads it
      synchronize_side_streams();
      deallocate(scratch, bytes);
    } catch (...) {
    }
    throw;
  }
  deallocate(scratch, bytes);
}

void Backend::order(Stream waiter, Stream producer) {
  const Event event = record(producer);
  wait(waiter, event);
  forget(event);
}

}  // namespace gtp::remat

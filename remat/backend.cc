#include "remat/backend.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gtp::remat {

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
  if (!open_) return;
  try {
    backend_.end_collectives();
  } catch (...) {  // only reached while an earlier error unwinds; that one is reported
  }
}

void Backend::order(Stream waiter, Stream producer) {
  const Event event = record(producer);
  wait(waiter, event);
  forget(event);
}

}  // namespace gtp::remat

#include "remat/grads.h"

#include <iterator>
#include <set>
#include <stdexcept>
#include <string>

namespace gtp::remat {

Grads::~Grads() {
  for (auto& [bytes, buffer] : pool_) {
    backend_.forget(buffer.ready);
    backend_.deallocate(buffer.ptr, bytes);
  }
  for (auto& [id, buffer] : handed_out_) {
    if (!buffer.main_grad) backend_.deallocate(buffer.ptr, buffer.bytes);
  }
  for (Pending& pending : pending_) backend_.deallocate(pending.reduced.ptr, pending.reduced.bytes);
}

Stream Grads::rs_stream(WeightId id) const {
  return backend_.side_stream(registry_.get(id).desc.group, Role::kReduceScatter);
}

// A free buffer of `bytes`: the one given back last. The in-place reduction holds a buffer until the
// next finalize, so buffers cycle through the weights of a backward; taking the latest keeps that cycle
// the same every step (each weight gets the same buffer: stable addresses for a CUDA graph captured
// after warm-up), where the oldest would alternate between steps.
Grads::Pooled Grads::take(std::int64_t bytes, Stream stream) {
  const auto [first, last] = pool_.equal_range(bytes);  // equal sizes keep their give-back order
  if (first != last) {
    const auto found = std::prev(last);
    Pooled buffer = found->second;
    pool_.erase(found);
    backend_.wait(stream, buffer.ready);  // its last reduce-scatter and add, nothing issued after them
    backend_.forget(buffer.ready);
    return buffer;
  }
  ++stats_.pool_buffers;
  return Pooled{static_cast<float*>(backend_.allocate(bytes)), bytes, 0};
}

void Grads::give_back(Pooled buffer, Stream stream) {
  buffer.copy = false;
  buffer.ready = backend_.record(stream);
  pool_.emplace(buffer.bytes, buffer);
}

bool Grads::busy(WeightId id) const {
  if (handed_out_.count(id) != 0) return true;
  for (const Pending& pending : pending_) {
    if (pending.id == id) return true;
  }
  return false;
}

bool Grads::into_main_grad(const Weight& weight) const {
  const int group = weight.desc.group;
  const bool enabled = config_.into_main_grad.empty() ||
                       (group < static_cast<int>(config_.into_main_grad.size()) && config_.into_main_grad[group]);
  return enabled && backend_.group_size(group) == 1 && weight.valid_rows == weight.desc.rows;
}

void Grads::declare_zeroed(const std::vector<WeightId>& ids) {
  for (WeightId id : ids) {  // everything checked first: a refusal declares nothing
    const Weight& weight = registry_.get(id);
    if (weight.desc.main_grad == nullptr && weight.valid_rows > 0) {
      throw std::invalid_argument("main_grads_zeroed: weight '" + weight.desc.name +
                                  "' was registered without a main grad; declare only weights that have one");
    }
    if (busy(id)) {
      throw std::invalid_argument("main_grads_zeroed: weight '" + weight.desc.name +
                                  "' has a grad buffer handed out or a main-grad add pending (declared before "
                                  "drain); drain first, then zero its main grad and declare it");
    }
  }
  for (WeightId id : ids) {
    if (registry_.get(id).valid_rows > 0) zeroed_.insert(id);
  }
}

GradBuffer Grads::buffer(WeightId id, Stream stream, GradInit init) {
  const Weight& weight = registry_.get(id);
  if (weight.desc.main_grad == nullptr && weight.valid_rows > 0) {
    throw std::invalid_argument("grad_buffer: weight '" + weight.desc.name +
                                "' was registered without a main grad; register it with main_grad set");
  }
  const auto held = handed_out_.find(id);
  if (held != handed_out_.end()) return GradBuffer{held->second.ptr, false};
  const Stream rs = rs_stream(id);
  const bool declared = zeroed_.erase(id) != 0;  // consumed by this first buffer
  if (declared && into_main_grad(weight)) {
    // Not busy (the declaration was refused otherwise, and only a buffer makes a weight busy); `rs`
    // may still run an earlier step's add or callback for it.
    backend_.order(stream, rs);
    handed_out_[id] = Pooled{weight.desc.main_grad, 0, 0, true};
    ++stats_.zeroed_handouts;
    return GradBuffer{weight.desc.main_grad, init != GradInit::kZero};
  }
  if (init == GradInit::kUndefined && into_main_grad(weight)) {
    // An add of an earlier buffer into this main grad may still be pending or running on `rs` (a size-1
    // group: its stream holds adds and callbacks, no reduce-scatter to queue behind).
    if (busy(id)) apply_pending();
    backend_.order(stream, rs);
    handed_out_[id] = Pooled{weight.desc.main_grad, 0, 0, true};
    return GradBuffer{weight.desc.main_grad, false};
  }
  const std::int64_t row_bytes = weight.desc.cols * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t bytes = weight.geometry.padded_rows * row_bytes;
  // The consumer waits for this buffer's own last use only and fills it itself: waiting on the whole
  // reduce-scatter stream would queue its wgrad behind the reduce-scatter of the weight finalized just
  // before (every reduce-scatter of a backward exposed).
  Pooled buffer = take(bytes, stream);
  // kUndefined leaves the weight's rows to the consumer's first write; the padding rows are never
  // written by it but are reduced, so they are zeroed either way.
  const bool zeroed = init == GradInit::kZero;
  const std::int64_t first_filled = zeroed ? 0 : weight.desc.rows;
  if (first_filled < weight.geometry.padded_rows) {
    backend_.fill(stream, buffer.ptr + first_filled * weight.desc.cols, 0, bytes - first_filled * row_bytes);
  }
  buffer.copy = declared;
  handed_out_[id] = buffer;
  return GradBuffer{buffer.ptr, !zeroed};
}

// This rank's reduced rows in a grad buffer of `weight`.
float* Grads::shard_of(const Weight& weight, float* full) const {
  return full + backend_.group_rank(weight.desc.group) * weight.geometry.shard_rows * weight.desc.cols;
}

void Grads::grad_ready(WeightId id, Stream rs) {
  if (config_.grad_ready) {  // by value: the callback may run after this object is gone
    backend_.host_callback(rs, [callback = config_.grad_ready, id] { callback(id); });
  }
  ++stats_.grads_ready;
}

void Grads::apply_pending() {
  for (Pending& pending : pending_) {
    const Weight& weight = registry_.get(pending.id);
    const Stream rs = rs_stream(pending.id);  // where the buffer was reduced
    if (weight.valid_rows > 0 && pending.reduced.copy) {
      backend_.copy(rs, shard_of(weight, pending.reduced.ptr), weight.desc.main_grad,
                    weight.valid_rows * weight.desc.cols);
      ++stats_.zeroed_copies;
    } else if (weight.valid_rows > 0) {
      backend_.add(rs, shard_of(weight, pending.reduced.ptr), weight.desc.main_grad,
                   weight.valid_rows * weight.desc.cols);
    }
    grad_ready(pending.id, rs);
    give_back(pending.reduced, rs);
  }
  pending_.clear();
}

void Grads::finalize(const std::vector<WeightId>& ids, bool last_microbatch, Stream stream) {
  std::set<WeightId> seen;
  for (WeightId id : ids) {
    const Weight& weight = registry_.get(id);
    if (!seen.insert(id).second) {
      throw std::invalid_argument("finalize: weight '" + weight.desc.name + "' is listed twice; list each weight once");
    }
    if (handed_out_.count(id) == 0) {
      throw std::invalid_argument("finalize: weight '" + weight.desc.name +
                                  "' has no grad buffer; call grad_buffer and add its wgrad before finalize");
    }
  }
  if (config_.accumulate_microbatches && !last_microbatch) return;
  apply_pending();
  std::set<Stream> ordered;  // each group's reduce-scatter stream waits on the consumer's wgrads once
  for (WeightId id : ids) {
    if (ordered.insert(rs_stream(id)).second) backend_.order(rs_stream(id), stream);
  }
  for (WeightId id : ids) {
    const Weight& weight = registry_.get(id);
    const Stream rs = rs_stream(id);
    const Pooled full = handed_out_[id];
    handed_out_.erase(id);
    if (full.main_grad) {  // the wgrads are in the main grad already (`rs` waits for them above)
      grad_ready(id, rs);
      ++stats_.into_main_grad;
      continue;
    }
    const std::int64_t count = weight.geometry.shard_rows * weight.desc.cols;
    if (config_.sum) {
      backend_.reduce_scatter_sum(rs, weight.desc.group, full.ptr, shard_of(weight, full.ptr), count);
    } else {
      backend_.reduce_scatter_mean(rs, weight.desc.group, full.ptr, shard_of(weight, full.ptr), count);
    }
    ++stats_.reduce_scatters;
    pending_.push_back(Pending{id, full});
  }
}

void Grads::drain(Stream stream) {
  apply_pending();
  backend_.join_all(stream);  // every group's gathers and reduce-scatters
}

}  // namespace gtp::remat

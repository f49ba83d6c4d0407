// What the fill-tag check adds to one fill on the CUDA backend (docs/reliability.md, "Ranks that
// disagree"): a fill's collective batch with one weight's all-gather, without and with the check (tag
// write + tag all-gather in the same NCCL group + check kernel), driven at the backend level. The
// checked fill twice: its tag written by the kernel (CudaFillTags::set_copy(false), the write before
// the ring: "checked") and copied from a page-locked ring slot (the eager default: "checked_copy",
// with how many of its tags the ring could not take, "copy_ring_full", which should be 0).
// - G = 1 (one GPU; the runtime itself skips the check there, so this is the check's cost on the
//   smallest NCCL path, where every op of the group is a launch of its own).
// - G = 2 (two threads on GPUs 0 and 1, when there are two): NCCL runs the group's ops in one launch,
//   as at any G > 1. Rank 0's figures.
// - The submissions one by one, on the side stream (host time per call): the tag write kernel, the
//   check kernel with 1 region (small parameters) and 5 (the 48-region set), and two other ways to
//   write a 64-byte tag: cudaMemcpyAsync from pinned memory and one cuStreamBatchMemOp of 8 64-bit
//   writes (when the driver has it).
// Host and stream time per fill, alternating plain / checked / checked_copy, medians of 5 rounds,
// inside one Backend::CallScope (as a runtime call); one JSON line.
// Says so and exits 0 without a device.
//   bazel run -c opt //bench/remat:fill_tag_cuda_bench
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/nccl.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/fill_tags_cuda.h"
#include "testing/remat/cuda_test_group.h"

namespace {

using gtp::remat::Backend;
using gtp::remat::CudaBackend;
using gtp::remat::FillTag;

constexpr int kFills = 2000, kRounds = 5;
constexpr std::int64_t kChunkBytes = 2048;  // a tiny weight: host cost dominates

struct Times {
  double host_us, stream_us;
};

// Host time per call of `work` and time until `stream` drained, per call, after 50 warm-up calls.
Times time_calls(cudaStream_t stream, const std::function<void()>& work, int calls = kFills) {
  for (int i = 0; i < 50; ++i) work();
  cudaStreamSynchronize(stream);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) work();
  const auto enqueued = std::chrono::steady_clock::now();
  cudaStreamSynchronize(stream);
  const auto done = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::micro>(enqueued - start).count() / calls,
          std::chrono::duration<double, std::micro>(done - start).count() / calls};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct FillCosts {
  double plain_host = 0, checked_host = 0, plain_stream = 0, checked_stream = 0;
  double copy_host = 0, copy_stream = 0;  // checked, the tag copied from the ring
  unsigned long long copy_ring_full = 0;  // tags of the copy rounds the kernel wrote (ring full)
};

// Alternating plain and checked fills on `backend`'s group 0 (collective: every rank runs it).
FillCosts fill_costs(CudaBackend& backend) {
  void* send = backend.allocate(kChunkBytes);
  void* recv = backend.allocate(kChunkBytes * backend.group_size(0));
  const gtp::remat::Stream stream = backend.side_stream(0, gtp::remat::Role::kGather);
  const Backend::FillTagCheck check = [](int, const FillTag*, int, const char*) {};
  FillTag tag;
  tag.count = 1;
  const auto plain = [&] {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(stream, 0, send, recv, kChunkBytes);
    batch.launch();
  };
  const auto checked = [&] {
    Backend::CollectiveBatch batch(backend);
    backend.check_fill_tags(stream, 0, tag, &check);
    backend.all_gather(stream, 0, send, recv, kChunkBytes);
    batch.launch();
  };
  gtp::remat::CudaFillTags& tags = backend.fill_tags();
  // As inside a runtime call: the side stream's capture status (check_fill_tags asks it, to choose
  // the copy or the kernel) is read once, not per fill.
  const Backend::CallScope call(backend);
  std::vector<double> ph, ps, ch, cs, yh, ys;
  unsigned long long ring_full = 0;
  for (int r = 0; r < kRounds; ++r) {
    const Times p = time_calls(static_cast<cudaStream_t>(stream), plain);
    tags.set_copy(false);
    const Times c = time_calls(static_cast<cudaStream_t>(stream), checked);
    tags.set_copy(true);
    const std::uint64_t full = tags.writes().ring_full;
    const Times y = time_calls(static_cast<cudaStream_t>(stream), checked);
    ring_full += tags.writes().ring_full - full;
    ph.push_back(p.host_us);
    ps.push_back(p.stream_us);
    ch.push_back(c.host_us);
    cs.push_back(c.stream_us);
    yh.push_back(y.host_us);
    ys.push_back(y.stream_us);
  }
  backend.deallocate(send, kChunkBytes);
  backend.deallocate(recv, kChunkBytes * backend.group_size(0));
  FillCosts costs{median(ph), median(ch), median(ps), median(cs)};
  costs.copy_host = median(yh);
  costs.copy_stream = median(ys);
  costs.copy_ring_full = ring_full;
  return costs;
}

// cuStreamBatchMemOp from the driver (libcuda is not linked), or null.
using BatchMemOp = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
BatchMemOp batch_mem_op() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<BatchMemOp>(fn);
}

// Host time per submission of each way to write or check a tag; -1 where unavailable.
struct Submissions {
  double write_kernel = -1, memcpy_pinned = -1, batch_mem_op = -1, verify_1 = -1, verify_5 = -1;
};

Submissions submissions(CudaBackend& backend) {
  using gtp::remat::PoisonRegion;
  const auto stream = static_cast<cudaStream_t>(backend.side_stream(0, gtp::remat::Role::kGather));
  auto* dst = static_cast<FillTag*>(backend.allocate(6 * sizeof(FillTag)));  // [send, gathered, 4 spare]
  void* poison = backend.allocate(5 * 256);
  gtp::remat::CudaFillTags verdict({1});
  FillTag tag;
  tag.count = 1;
  cudaMemcpy(dst + 1, &tag, sizeof tag, cudaMemcpyHostToDevice);  // gathered == mine: nothing poisoned
  std::vector<PoisonRegion> one{{poison, 256}}, five;
  for (int k = 0; k < 5; ++k) five.push_back({static_cast<char*>(poison) + 256 * k, 256});
  std::vector<std::vector<double>> t(5);
  FillTag* pinned = nullptr;
  cudaMallocHost(&pinned, sizeof(FillTag));
  *pinned = tag;
  const BatchMemOp memop = batch_mem_op();
  CUstreamBatchMemOpParams ops[8] = {};
  for (int k = 0; k < 8; ++k) {
    ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[k].writeValue.address = reinterpret_cast<CUdeviceptr>(dst) + 8 * k;
    ops[k].writeValue.value64 = reinterpret_cast<const cuuint64_t*>(&tag)[k];
    ops[k].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  bool memop_ok = memop != nullptr && memop(stream, 8, ops, 0) == CUDA_SUCCESS;
  cudaStreamSynchronize(stream);
  for (int r = 0; r < kRounds; ++r) {
    t[0].push_back(time_calls(stream, [&] { gtp::remat::write_fill_tag_cuda(tag, dst, stream); }).host_us);
    t[1].push_back(time_calls(stream, [&] {
                     cudaMemcpyAsync(dst, pinned, sizeof(FillTag), cudaMemcpyHostToDevice, stream);
                   }).host_us);
    if (memop_ok) t[2].push_back(time_calls(stream, [&] { memop(stream, 8, ops, 0); }).host_us);
    t[3].push_back(time_calls(stream, [&] {
                     gtp::remat::verify_fill_tags_cuda(dst + 1, 1, tag, 0, one, verdict.device_verdict(), stream);
                   }).host_us);
    t[4].push_back(time_calls(stream, [&] {
                     gtp::remat::verify_fill_tags_cuda(dst + 1, 1, tag, 0, five, verdict.device_verdict(), stream);
                   }).host_us);
  }
  FillTag back;
  cudaMemcpy(&back, dst, sizeof back, cudaMemcpyDeviceToHost);
  if (memop_ok && !(back == tag)) memop_ok = false;  // the writes must have landed
  Submissions s;
  s.write_kernel = median(t[0]);
  s.memcpy_pinned = median(t[1]);
  if (memop_ok) s.batch_mem_op = median(t[2]);
  s.verify_1 = median(t[3]);
  s.verify_5 = median(t[4]);
  cudaFreeHost(pinned);
  backend.deallocate(poison, 5 * 256);
  backend.deallocate(dst, 6 * sizeof(FillTag));
  return s;
}

// Two ranks on GPUs 0 and 1, as threads; rank 0's costs. Null without two devices.
bool two_rank_costs(FillCosts* out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) return false;
  const std::chrono::milliseconds timeout(60000);
  auto bootstraps = gtp::comm::ThreadBootstrap::create_group(2, timeout);
  std::vector<FillCosts> costs(2);
  gtp::comm::internal::rethrow_first(gtp::comm::internal::run_ranks(2, [&](int rank) {
    cudaSetDevice(rank);
    gtp::comm::NcclComm world = gtp::comm::NcclComm::create_world(*bootstraps[rank], timeout);
    gtp::comm::NcclComm rs = world.split({{0, 1}}, {}, timeout);
    CudaBackend backend(rank, {gtp::remat::CudaGroup{&world, &rs}}, timeout);
    costs[rank] = fill_costs(backend);
  }));
  *out = costs[0];
  return true;
}

}  // namespace

int main() {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) {
    std::printf("fill_tag_cuda_bench: no CUDA device (%s); nothing measured\n", why.c_str());
    return 0;
  }
  FillCosts one;
  Submissions s;
  {
    gtp::remat::testing::SizeOneGroup group;
    CudaBackend backend(0, group.groups(), std::chrono::milliseconds(30000));
    one = fill_costs(backend);
    s = submissions(backend);
  }
  FillCosts two;
  const bool have_two = two_rank_costs(&two);
  std::printf("{\"fill\": \"one %lld-byte all_gather\", \"plain_host_us\": %.2f, \"checked_host_us\": %.2f, "
              "\"checked_copy_host_us\": %.2f, \"plain_stream_us\": %.2f, \"checked_stream_us\": %.2f, "
              "\"checked_copy_stream_us\": %.2f, \"copy_ring_full\": %llu, \"ring_slots\": %d, ",
              static_cast<long long>(kChunkBytes), one.plain_host, one.checked_host, one.copy_host, one.plain_stream,
              one.checked_stream, one.copy_stream, one.copy_ring_full, gtp::remat::CudaFillTags::kRingSlots);
  if (have_two) {
    std::printf("\"g2_plain_host_us\": %.2f, \"g2_checked_host_us\": %.2f, \"g2_checked_copy_host_us\": %.2f, "
                "\"g2_plain_stream_us\": %.2f, \"g2_checked_stream_us\": %.2f, \"g2_checked_copy_stream_us\": %.2f, "
                "\"g2_copy_ring_full\": %llu, ",
                two.plain_host, two.checked_host, two.copy_host, two.plain_stream, two.checked_stream, two.copy_stream,
                two.copy_ring_full);
  } else {
    std::printf("\"g2\": \"not run: needs 2 CUDA devices\", ");
  }
  std::printf("\"submit_write_kernel_us\": %.2f, \"submit_memcpy_pinned_us\": %.2f, \"submit_batch_mem_op_us\": %.2f, "
              "\"submit_verify_1_region_us\": %.2f, \"submit_verify_5_regions_us\": %.2f, "
              "\"extra_bytes_per_rank\": %zu}\n",
              s.write_kernel, s.memcpy_pinned, s.batch_mem_op, s.verify_1, s.verify_5, sizeof(FillTag));
  return 0;
}

// What the fill-tag check adds to one fill on the CUDA backend (docs/reliability.md, "Ranks that
// disagree"), on one GPU: a fill's collective batch with one weight's all-gather, without and with
// the check (tag write kernel + tag all-gather in the same NCCL group + check kernel). The check is
// driven at the backend level, since the runtime skips it on a size-1 group. Prints host and stream
// time per fill for each, alternating, medians of 5 rounds. Says so and exits 0 without a device.
//   bazel run -c opt //bench/remat:fill_tag_cuda_bench
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/internal/cuda_test_group.h"

namespace {

using gtp::remat::Backend;
using gtp::remat::FillTag;

constexpr int kFills = 2000, kRounds = 5;
constexpr std::int64_t kChunkBytes = 2048;  // a tiny weight: host cost dominates

struct Times {
  double host_us, stream_us;
};

template <typename Fill>
Times time_fills(gtp::remat::CudaBackend& backend, Fill&& fill) {
  const auto stream = static_cast<cudaStream_t>(backend.side_stream(0, gtp::remat::Role::kGather));
  for (int i = 0; i < 50; ++i) fill();
  cudaStreamSynchronize(stream);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kFills; ++i) fill();
  const auto enqueued = std::chrono::steady_clock::now();
  cudaStreamSynchronize(stream);
  const auto done = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::micro>(enqueued - start).count() / kFills,
          std::chrono::duration<double, std::micro>(done - start).count() / kFills};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) {
    std::printf("fill_tag_cuda_bench: no CUDA device (%s); nothing measured\n", why.c_str());
    return 0;
  }
  gtp::remat::testing::SizeOneGroup group;
  gtp::remat::CudaBackend backend(0, group.groups(), std::chrono::milliseconds(30000));
  void* send = backend.allocate(kChunkBytes);
  void* recv = backend.allocate(kChunkBytes);
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
  std::vector<double> plain_host, plain_stream, checked_host, checked_stream;
  for (int r = 0; r < kRounds; ++r) {
    const Times p = time_fills(backend, plain), c = time_fills(backend, checked);
    plain_host.push_back(p.host_us);
    plain_stream.push_back(p.stream_us);
    checked_host.push_back(c.host_us);
    checked_stream.push_back(c.stream_us);
  }
  std::printf("{\"fill\": \"one %lld-byte all_gather, size-1 NCCL group\", \"plain_host_us\": %.2f, "
              "\"checked_host_us\": %.2f, \"plain_stream_us\": %.2f, \"checked_stream_us\": %.2f, "
              "\"extra_bytes_per_rank\": %zu}\n",
              static_cast<long long>(kChunkBytes), median(plain_host), median(checked_host), median(plain_stream),
              median(checked_stream), sizeof(FillTag));
  backend.deallocate(send, kChunkBytes);
  backend.deallocate(recv, kChunkBytes);
  return 0;
}

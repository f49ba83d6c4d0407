// GPU test of the CUDA backend's fill-tag check (docs/reliability.md, "Ranks that disagree"): the
// check kernel on one device, the whole check through the backend with a fake peer (a test transport)
// on one device, and two ranks on two devices gathering different weights. Skips,
// printing why, without a CUDA device (the two-rank case without two).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/nccl.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/device_collectives.h"
#include "remat/fill_tags_cuda.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;

void must(cudaError_t status) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(status));
}

FillTag tag_of(std::uint64_t weights) {
  FillTag tag;
  tag.weights = weights;
  tag.count = 1;
  return tag;
}

// Regions of distinct sizes, filled with 0x11; more than one launch's worth.
struct Regions {
  std::vector<PoisonRegion> list;
  explicit Regions(int n) {
    for (int i = 0; i < n; ++i) {
      const std::int64_t bytes = 256 * (1 + i % 5);
      void* ptr = nullptr;
      must(cudaMalloc(&ptr, bytes));
      must(cudaMemset(ptr, 0x11, bytes));
      list.push_back({ptr, bytes});
    }
  }
  ~Regions() {
    for (const PoisonRegion& r : list) cudaFree(r.ptr);
  }
  // Whether every byte of every region is `byte`.
  bool all(unsigned char byte) const {
    for (const PoisonRegion& r : list) {
      std::vector<unsigned char> host(static_cast<std::size_t>(r.bytes));
      must(cudaMemcpy(host.data(), r.ptr, host.size(), cudaMemcpyDeviceToHost));
      for (unsigned char b : host) {
        if (b != byte) return false;
      }
    }
    return true;
  }
};

TEST(CudaFillTags, MatchingTagsLeaveTheGatherAloneAndADifferingOnePoisonsItAndSetsTheVerdict) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  CudaFillTags tags({3});
  const FillTag mine = tag_of(7);
  std::vector<FillTag> gathered = {mine, mine, mine};
  const Regions regions(kPoisonRegionsPerLaunch + 3);
  must(cudaMemcpy(tags.recv(0), gathered.data(), 3 * sizeof(FillTag), cudaMemcpyHostToDevice));
  verify_fill_tags_cuda(tags.recv(0), 3, mine, 0, regions.list, tags.device_verdict(), nullptr);
  must(cudaDeviceSynchronize());
  EXPECT_EQ(tags.found(), nullptr);
  EXPECT_TRUE(regions.all(0x11));

  gathered[1] = tag_of(8);  // rank 1 gathered another weight
  must(cudaMemcpy(tags.recv(0), gathered.data(), 3 * sizeof(FillTag), cudaMemcpyHostToDevice));
  verify_fill_tags_cuda(tags.recv(0), 3, mine, 1, regions.list, tags.device_verdict(), nullptr);
  must(cudaDeviceSynchronize());
  const FillTagVerdict* verdict = tags.found();
  ASSERT_NE(verdict, nullptr);
  EXPECT_EQ(verdict->group, 1);
  ASSERT_EQ(verdict->count, 3);
  EXPECT_EQ(verdict->tags[0].weights, 7u);
  EXPECT_EQ(verdict->tags[1].weights, 8u);
  EXPECT_TRUE(regions.all(0xFF)) << "every region, past the first launch's " << kPoisonRegionsPerLaunch;
}

TEST(CudaFillTags, WriteKernelPutsTheTagOnTheDevice) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  CudaFillTags tags({2});
  const FillTag mine = tag_of(42);
  write_fill_tag_cuda(mine, tags.send(0), nullptr);
  FillTag back;
  must(cudaMemcpy(&back, tags.send(0), sizeof back, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == mine);
}

// A test transport of two ranks, this one rank 0, on one device: the peer's half of every gather is
// this rank's data, or 0x5A bytes where `peer_differs` (so its tag differs too).
class FakePeer : public DeviceCollectives {
 public:
  explicit FakePeer(const bool* peer_differs) : peer_differs_(peer_differs) {}
  int group_count() const override { return 1; }
  int size(int) const override { return 2; }
  int rank(int) const override { return 0; }
  void all_gather(cudaStream_t stream, int, const void* send, void* recv, std::int64_t bytes) override {
    char* peer = static_cast<char*>(recv) + bytes;
    if (recv != send) {  // the warm-up gathers in place
      must(cudaMemcpyAsync(recv, send, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
    if (*peer_differs_) {
      must(cudaMemsetAsync(peer, 0x5A, static_cast<std::size_t>(bytes), stream));
    } else {
      must(cudaMemcpyAsync(peer, send, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
  }
  void all_reduce_max(cudaStream_t, int, float*, std::int64_t) override {}
  void reduce_scatter_mean(cudaStream_t stream, int, const float* send, float* recv, std::int64_t count) override {
    if (recv != send) must(cudaMemcpyAsync(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
  void* allocate(std::int64_t bytes) override {
    void* ptr = nullptr;
    must(cudaMalloc(&ptr, static_cast<std::size_t>(bytes)));
    return ptr;
  }
  void deallocate(void* ptr) override { cudaFree(ptr); }

 private:
  const bool* peer_differs_;
};

// Through the backend on one GPU: a fill of three gathers, the first two back to back (one poison
// region), the third after a gap. Matching tags leave the gathered bytes as gathered; a peer with
// another tag gets every gathered byte set to 0xFF, the gap left alone, and the next call throws.
TEST(CudaFillTags, ThroughTheBackendAPeerWithAnotherTagPoisonsEveryGatherAndNothingElse) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  bool peer_differs = false;
  CudaBackend backend(0, std::make_unique<FakePeer>(&peer_differs));
  const Stream stream = backend.side_stream(0, Role::kGather);
  constexpr std::int64_t kChunk = 256, kGap = 512;
  // [gather 0: 2 chunks][gather 1: 2 chunks][gap][gather 2: 2 chunks]
  const std::int64_t total = 6 * kChunk + kGap;
  char* recv = static_cast<char*>(backend.allocate(total));
  char* send = static_cast<char*>(backend.allocate(kChunk));
  must(cudaMemset(send, 0x11, kChunk));
  int reported = 0;
  const Backend::FillTagCheck check = [&](int, const FillTag*, int count, const char*) {
    ++reported;
    EXPECT_EQ(count, 2);
    throw std::runtime_error("the ranks' fill tags differ");
  };
  const auto fill = [&](std::uint64_t weights) {
    must(cudaMemset(recv, 0x22, total));
    Backend::CollectiveBatch batch(backend);
    backend.check_fill_tags(stream, 0, tag_of(weights), &check);
    backend.all_gather(stream, 0, send, recv, kChunk);
    backend.all_gather(stream, 0, send, recv + 2 * kChunk, kChunk);
    backend.all_gather(stream, 0, send, recv + 4 * kChunk + kGap, kChunk);
    batch.launch();
    must(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    std::vector<unsigned char> host(static_cast<std::size_t>(total));
    must(cudaMemcpy(host.data(), recv, host.size(), cudaMemcpyDeviceToHost));
    return host;
  };
  // Two fills with different tags, the peer agreeing: had the second gathered its tag before writing
  // it, both ranks' gathered tags would be the first fill's, and the check would poison.
  for (std::uint64_t weights : {7, 8}) {
    const std::vector<unsigned char> host = fill(weights);
    for (std::int64_t i = 0; i < total; ++i) {
      const bool gap = i >= 4 * kChunk && i < 4 * kChunk + kGap;
      ASSERT_EQ(host[i], gap ? 0x22 : 0x11) << "byte " << i << " with matching tags, fill " << weights;
    }
    EXPECT_NO_THROW(Backend::CallScope call(backend));
  }
  peer_differs = true;
  const std::vector<unsigned char> host = fill(9);
  for (std::int64_t i = 0; i < total; ++i) {
    const bool gap = i >= 4 * kChunk && i < 4 * kChunk + kGap;
    ASSERT_EQ(host[i], gap ? 0x22 : 0xFF) << "byte " << i << " after a mismatch";
  }
  EXPECT_THROW(Backend::CallScope call(backend), std::runtime_error);
  EXPECT_EQ(reported, 1);
  backend.deallocate(send, kChunk);
  backend.deallocate(recv, total);
}

bool is_nan_bf16(std::uint16_t bits) { return (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0; }

class TwoRanks : public testing::TestWithParam<kernels::WireFormat> {};

// Rank r materializes weight r: the pointer it gets holds NaN only (the BF16 wire gathers in place, FP8
// is unpacked from poisoned chunks) and its next call throws, naming both weights. The control: both
// ranks materialize w0 and get it exactly (BF16) or finitely (FP8), with no error.
TEST_P(TwoRanks, GatheringDifferentWeightsGivesNaNAndAnErrorAtTheNextCall) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  int devices = 0;
  must(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices;
  constexpr std::int64_t kRows = 64, kCols = 64;  // 32 rows per rank
  const milliseconds timeout(120000);
  auto bootstraps = comm::ThreadBootstrap::create_group(2, timeout);
  std::vector<std::string> errors(2);
  comm::internal::rethrow_first(comm::internal::run_ranks(2, [&](int rank) {
    must(cudaSetDevice(rank));
    comm::NcclComm world = comm::NcclComm::create_world(*bootstraps[rank], timeout);
    comm::NcclComm rs = world.split({{0, 1}}, {}, timeout);
    CudaBackend backend(rank, {CudaGroup{&world, &rs}}, timeout);
    RuntimeConfig config;
    config.depth = 0;
    Runtime runtime(backend, config);
    std::vector<void*> shards;
    std::vector<WeightId> ids;
    for (int k = 0; k < 2; ++k) {
      std::vector<std::uint16_t> host(kRows / 2 * kCols, static_cast<std::uint16_t>(0x3f80 + 0x40 * k));  // 1.0, 2.0
      void* shard = nullptr;
      must(cudaMalloc(&shard, host.size() * 2));
      must(cudaMemcpy(shard, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
      shards.push_back(shard);
      WeightDesc desc;
      desc.name = "w" + std::to_string(k);
      desc.shard = shard;
      desc.rows = kRows;
      desc.cols = kCols;
      desc.wire.format = GetParam();
      ids.push_back(runtime.register_weight(desc));
    }
    cudaStream_t stream = nullptr;
    must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    runtime.shard_updated(ids.data(), 2, stream);
    const auto read = [&](void* ptr) {
      std::vector<std::uint16_t> out(kRows * kCols);
      must(cudaStreamSynchronize(stream));
      must(cudaMemcpy(out.data(), ptr, out.size() * 2, cudaMemcpyDeviceToHost));
      return out;
    };
    // The control.
    void* ptr = runtime.materialize(&ids[0], 1, Phase::kForward, 0, Layout::kBF16, stream)[0];
    for (std::uint16_t bits : read(ptr)) ASSERT_EQ(bits, 0x3f80);
    runtime.release(&ids[0], 1, stream);
    // Rank r gathers weight r.
    ptr = runtime.materialize(&ids[rank], 1, Phase::kForward, 0, Layout::kBF16, stream)[0];
    for (std::uint16_t bits : read(ptr)) ASSERT_TRUE(is_nan_bf16(bits)) << std::hex << bits;
    try {
      runtime.release(&ids[rank], 1, stream);
      ADD_FAILURE() << "rank " << rank << ": release after a diverged gather did not throw";
    } catch (const DivergenceError& e) {
      errors[rank] = e.what();
    }
    must(cudaStreamSynchronize(stream));
    cudaStreamDestroy(stream);
    for (void* shard : shards) cudaFree(shard);
  }));
  for (const std::string& text : errors) {
    for (const char* part : {"found on the device after the gather", "rank 0 gathers 'w0'", "rank 1 gathers 'w1'"}) {
      EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in: " << text;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, TwoRanks, testing::Values(kernels::WireFormat::kBF16, kernels::WireFormat::kFP8));

}  // namespace
}  // namespace gtp::remat

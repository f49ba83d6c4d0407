// GPU test of the CUDA backend's fill-tag check (docs/reliability.md, "Ranks that disagree"): the
// check kernel on one device, the tag write (a copy from the ring of page-locked slots, or the kernel)
// with the GPU held back so that the host runs far ahead of it, the whole check through the backend
// with a fake peer (a test transport) on one device, eager and captured, and two ranks on two
// devices gathering different weights. Skips, printing why, without a CUDA device (the two-rank case
// without two).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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

// A non-blocking stream, destroyed when the test leaves its scope (an ASSERT included).
struct OwnedStream {
  cudaStream_t stream = nullptr;
  OwnedStream() { must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(stream); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  operator cudaStream_t() const { return stream; }
};

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

// Holds `stream` back: a host function that returns once open() is called (or after 30 s, which
// the test reports), so everything enqueued behind it waits. Opened at destruction at the latest.
class Gate {
 public:
  explicit Gate(cudaStream_t stream) : stream_(stream) { must(cudaLaunchHostFunc(stream, &Gate::hold, this)); }
  ~Gate() {
    open();
    cudaStreamSynchronize(stream_);  // the host function must not outlive the gate
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void open() { open_.store(true); }
  // After the stream has run past the gate: whether it gave up waiting.
  bool timed_out() const { return timed_out_.load(); }

 private:
  static void hold(void* data) {  // runs on CUDA's callback thread; calls no CUDA
    auto* gate = static_cast<Gate*>(data);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gate->open_.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        gate->timed_out_.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  cudaStream_t stream_;
  std::atomic<bool> open_{false};
  std::atomic<bool> timed_out_{false};
};

// Device memory for n tags, read back on the host.
struct TagLog {
  FillTag* device = nullptr;
  int capacity;
  explicit TagLog(int n) : capacity(n) {
    void* ptr = nullptr;
    must(cudaMalloc(&ptr, sizeof(FillTag) * static_cast<std::size_t>(n)));
    must(cudaMemset(ptr, 0, sizeof(FillTag) * static_cast<std::size_t>(n)));
    device = static_cast<FillTag*>(ptr);
  }
  ~TagLog() { cudaFree(device); }
  std::vector<FillTag> read() const {
    std::vector<FillTag> host(static_cast<std::size_t>(capacity));
    must(cudaMemcpy(host.data(), device, host.size() * sizeof(FillTag), cudaMemcpyDeviceToHost));
    return host;
  }
};

// One fill of `tags` as the backend runs it, two ranks agreeing: the write, a gather of the send tag
// (both "ranks" are this one), a copy of what was gathered into log[index], then the check.
void fill_with(CudaFillTags& tags, const FillTag& mine, cudaStream_t stream, const TagLog& log, int index,
               bool captured = false) {
  tags.write(0, mine, stream, captured);
  for (int r = 0; r < 2; ++r) {
    must(cudaMemcpyAsync(tags.recv(0) + r, tags.send(0), sizeof(FillTag), cudaMemcpyDeviceToDevice, stream));
  }
  must(cudaMemcpyAsync(log.device + index, tags.recv(0) + 1, sizeof(FillTag), cudaMemcpyDeviceToDevice, stream));
  tags.pending.regions.clear();
  tags.verify(2);
}

TEST(CudaFillTags, CopiedTagsAreWhatIsGatheredAndNoSlotIsReusedBeforeItsCopyRan) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kSlots = 8, kOver = 5, kLaps = 3;
  CudaFillTags tags({2}, kSlots);
  const OwnedStream stream;
  const TagLog log(kLaps * (kSlots + kOver));
  int index = 0;
  for (int lap = 0; lap < kLaps; ++lap) {
    // The GPU runs none of this lap's fills until the host has enqueued them all: the first kSlots
    // take every slot (from the second lap on, slots the previous lap's checks released), the rest
    // find the next slot unread and write with the kernel. A slot handed out again too early would
    // have its tag overwritten before its copy ran: the log and the check would show it.
    Gate gate(stream);
    for (int k = 0; k < kSlots + kOver; ++k, ++index) {
      fill_with(tags, tag_of(1000 + static_cast<std::uint64_t>(index)), stream, log, index);
    }
    EXPECT_EQ(tags.writes().copied, static_cast<std::uint64_t>((lap + 1) * kSlots)) << "lap " << lap;
    EXPECT_EQ(tags.writes().ring_full, static_cast<std::uint64_t>((lap + 1) * kOver)) << "lap " << lap;
    gate.open();
    must(cudaStreamSynchronize(stream));
    ASSERT_FALSE(gate.timed_out()) << "the host blocked while the GPU was held (a full launch queue?)";
  }
  const std::vector<FillTag> gathered = log.read();
  for (int i = 0; i < index; ++i) {
    EXPECT_EQ(gathered[i].weights, 1000u + static_cast<std::uint64_t>(i)) << "fill " << i;
  }
  EXPECT_EQ(tags.found(), nullptr) << "every fill's check saw its own tag";
  EXPECT_EQ(tags.writes().abandoned, 0u);
  EXPECT_EQ(tags.ring().lost(), 0);
}

TEST(CudaFillTags, ACopyWhoseCheckNeverRunsIsReleasedByItsEvent) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  CudaFillTags tags({2}, 2);
  const OwnedStream stream;
  const TagLog log(4);
  {
    Gate gate(stream);
    tags.write(0, tag_of(1), stream, false);  // its batch is cancelled: no check
    ASSERT_EQ(tags.pending.slot, 0);
    tags.abandon();
    EXPECT_EQ(tags.pending.slot, -1);
    EXPECT_EQ(tags.writes().abandoned, 1u);
    EXPECT_EQ(tags.ring().gate(0), FillTagRing::Gate::kEvent);
    fill_with(tags, tag_of(2), stream, log, 0);  // slot 1
    fill_with(tags, tag_of(3), stream, log, 1);  // slot 0's event is behind the gate: the kernel
    EXPECT_EQ(tags.writes().copied, 2u);
    EXPECT_EQ(tags.writes().ring_full, 1u);
    gate.open();
    must(cudaStreamSynchronize(stream));
    ASSERT_FALSE(gate.timed_out());
  }
  fill_with(tags, tag_of(4), stream, log, 2);  // slot 0 again, its event complete
  EXPECT_EQ(tags.writes().copied, 3u);
  EXPECT_EQ(tags.writes().ring_full, 1u);
  // A write whose check never came is abandoned by the next write.
  tags.write(0, tag_of(5), stream, false);
  EXPECT_EQ(tags.pending.slot, 1);
  fill_with(tags, tag_of(6), stream, log, 3);
  EXPECT_EQ(tags.writes().abandoned, 2u);
  must(cudaStreamSynchronize(stream));
  const std::vector<FillTag> gathered = log.read();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gathered[i].weights, static_cast<std::uint64_t>(i == 3 ? 6 : i + 2));
  EXPECT_EQ(tags.found(), nullptr);
}

TEST(CudaFillTags, CapturedWritesUseTheKernelAndCopyingOffToo) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  CudaFillTags tags({2}, 2);
  const OwnedStream stream;
  const TagLog log(3);
  fill_with(tags, tag_of(1), stream, log, 0, /*captured=*/true);  // (the flag only: the backend's capture below)
  EXPECT_EQ(tags.pending.slot, -1);
  tags.set_copy(false);
  fill_with(tags, tag_of(2), stream, log, 1);
  tags.set_copy(true);
  fill_with(tags, tag_of(3), stream, log, 2);
  must(cudaStreamSynchronize(stream));
  EXPECT_EQ(tags.writes().captured, 1u);
  EXPECT_EQ(tags.writes().copy_off, 1u);
  EXPECT_EQ(tags.writes().copied, 1u);
  const std::vector<FillTag> gathered = log.read();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(gathered[i].weights, static_cast<std::uint64_t>(i + 1));
  EXPECT_EQ(tags.found(), nullptr);
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
// With a `log`, each gathered tag (a 64-byte gather that is not in place) is also copied, as the
// peer received it, to the log's next entry, on the gather's stream (so a captured one is replayed).
class FakePeer : public DeviceCollectives {
 public:
  explicit FakePeer(const bool* peer_differs, const TagLog* log = nullptr) : peer_differs_(peer_differs), log_(log) {}
  int tags_logged() const { return logged_; }
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
    if (log_ != nullptr && bytes == static_cast<std::int64_t>(sizeof(FillTag)) && recv != send) {
      if (logged_ >= log_->capacity) throw std::runtime_error("FakePeer: the tag log is full");
      must(cudaMemcpyAsync(log_->device + logged_++, send, sizeof(FillTag), cudaMemcpyDeviceToDevice, stream));
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
  const TagLog* log_;
  int logged_ = 0;
};

// The runtime's check where tags differ (the verdict is what these tests look at).
const Backend::FillTagCheck kThrowOnMismatch = [](int, const FillTag*, int, const char*) {
  throw std::runtime_error("the ranks' fill tags differ");
};

// One fill of group 0 as the runtime enqueues it: the tag, one gather of `bytes`, the launch.
void fill_of(CudaBackend& backend, Stream stream, std::uint64_t weights, const void* send, void* recv,
             std::int64_t bytes) {
  Backend::CollectiveBatch batch(backend);
  backend.check_fill_tags(stream, 0, tag_of(weights), &kThrowOnMismatch);
  backend.all_gather(stream, 0, send, recv, bytes);
  batch.launch();
}

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
  EXPECT_EQ(backend.fill_tags().writes().copied, 3u) << "eager fills copy their tag from the ring";
  backend.deallocate(send, kChunk);
  backend.deallocate(recv, total);
}

// Through the backend, eager: many fills enqueued faster than the GPU runs them, each with its own
// tag; every fill's gathered tag is the one it wrote, and every check agrees. First with the GPU
// held until all are enqueued (fewer than the ring's slots: all copied), then free-running over
// several laps of the ring (slots reused as the checks release them; the kernel where none is).
TEST(CudaFillTags, ThroughTheBackendEveryEagerFillGathersTheTagItCopied) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kHeld = 64, kRunning = 3 * CudaFillTags::kRingSlots;
  const TagLog log(kHeld + kRunning);
  bool peer_differs = false;
  auto peer = std::make_unique<FakePeer>(&peer_differs, &log);
  const FakePeer& fake = *peer;
  CudaBackend backend(0, std::move(peer));
  const Stream stream = backend.side_stream(0, Role::kGather);
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr std::int64_t kChunk = 256;
  char* recv = static_cast<char*>(backend.allocate(2 * kChunk));
  char* send = static_cast<char*>(backend.allocate(kChunk));
  must(cudaMemset(send, 0x11, kChunk));
  int fills = 0;
  const auto fill = [&] { fill_of(backend, stream, 5000 + static_cast<std::uint64_t>(fills++), send, recv, kChunk); };
  const CudaFillTags::Writes before = backend.fill_tags().writes();
  {
    Gate gate(s);
    for (int k = 0; k < kHeld; ++k) fill();
    gate.open();
    must(cudaStreamSynchronize(s));
    ASSERT_FALSE(gate.timed_out()) << "the host blocked while the GPU was held (a full launch queue?)";
  }
  const CudaFillTags::Writes held = backend.fill_tags().writes();
  EXPECT_EQ(held.copied - before.copied, static_cast<std::uint64_t>(kHeld));
  EXPECT_EQ(held.ring_full, before.ring_full);
  for (int k = 0; k < kRunning; ++k) fill();
  must(cudaStreamSynchronize(s));
  const CudaFillTags::Writes after = backend.fill_tags().writes();
  EXPECT_EQ(after.copied + after.ring_full - held.copied - held.ring_full, static_cast<std::uint64_t>(kRunning));
  EXPECT_GT(after.copied - held.copied, static_cast<std::uint64_t>(CudaFillTags::kRingSlots)) << "slots reused";
  std::printf("free-running: %llu of %d tags copied, %llu written by the kernel (ring full)\n",
              static_cast<unsigned long long>(after.copied - held.copied), kRunning,
              static_cast<unsigned long long>(after.ring_full - held.ring_full));
  ASSERT_EQ(fake.tags_logged(), fills);
  const std::vector<FillTag> gathered = log.read();
  for (int i = 0; i < fills; ++i) {
    ASSERT_EQ(gathered[i].weights, 5000u + static_cast<std::uint64_t>(i)) << "fill " << i << " gathered another tag";
  }
  EXPECT_NO_THROW(Backend::CallScope call(backend)) << "every check saw its own tag";
  EXPECT_EQ(after.abandoned, 0u);
  backend.deallocate(send, kChunk);
  backend.deallocate(recv, 2 * kChunk);
}

// A batch cancelled after its tag was copied (a gather refused: an unknown group) releases the slot
// by an event; fills go on copying.
TEST(CudaFillTags, ThroughTheBackendACancelledBatchReleasesItsSlotByAnEvent) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  bool peer_differs = false;
  CudaBackend backend(0, std::make_unique<FakePeer>(&peer_differs));
  const Stream stream = backend.side_stream(0, Role::kGather);
  char* buffer = static_cast<char*>(backend.allocate(512));
  const std::uint64_t copied = backend.fill_tags().writes().copied;
  EXPECT_THROW(
      {
        Backend::CollectiveBatch batch(backend);
        backend.check_fill_tags(stream, 0, tag_of(1), &kThrowOnMismatch);
        backend.all_gather(stream, 7, buffer, buffer + 256, 128);  // no group 7
        batch.launch();
      },
      std::invalid_argument);
  EXPECT_EQ(backend.fill_tags().writes().copied, copied + 1);
  EXPECT_EQ(backend.fill_tags().writes().abandoned, 1u);
  EXPECT_THROW(
      {
        Backend::CollectiveBatch batch(backend);
        backend.check_fill_tags(stream, 7, tag_of(1), &kThrowOnMismatch);
      },
      std::invalid_argument)
      << "an unknown group is refused before any tag is written";
  EXPECT_EQ(backend.fill_tags().writes().copied, copied + 1);
  must(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  for (int k = 0; k < CudaFillTags::kRingSlots + 1; ++k) {  // a lap: the abandoned slot comes round again
    fill_of(backend, stream, 2, buffer, buffer + 256, 128);
    must(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  EXPECT_EQ(backend.fill_tags().writes().copied, copied + 2 + CudaFillTags::kRingSlots);
  EXPECT_EQ(backend.fill_tags().writes().ring_full, 0u);
  EXPECT_EQ(backend.fill_tags().ring().lost(), 0);
  EXPECT_NO_THROW(Backend::CallScope call(backend));
  backend.deallocate(buffer, 512);
}

// A fill recorded into a graph (begin_graph / end_graph, as fill graphs do) writes its tag with the
// kernel, so every replay gathers the tag it was recorded with, whatever eager fills put in the ring
// slots since; and its check, recorded with it, agrees.
TEST(CudaFillTags, ThroughTheBackendACapturedFillReplaysTheTagItWasRecordedWith) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  const TagLog log(64);
  bool peer_differs = false;
  auto peer = std::make_unique<FakePeer>(&peer_differs, &log);
  const FakePeer& fake = *peer;
  CudaBackend backend(0, std::move(peer));
  const Stream stream = backend.side_stream(0, Role::kGather);
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr std::int64_t kChunk = 256;
  char* recv = static_cast<char*>(backend.allocate(2 * kChunk));
  char* send = static_cast<char*>(backend.allocate(kChunk));
  must(cudaMemset(send, 0x11, kChunk));
  const auto fill = [&](std::uint64_t weights) { fill_of(backend, stream, weights, send, recv, kChunk); };
  fill(1);  // eager, before the recording: slot 0 holds tag 1
  must(cudaStreamSynchronize(s));
  const CudaFillTags::Writes before = backend.fill_tags().writes();
  const int recorded = fake.tags_logged();  // the log entry the graph's tag gather writes
  backend.begin_graph(stream);
  fill(77);
  const Backend::Graph graph = backend.end_graph(stream);
  EXPECT_EQ(backend.fill_tags().writes().captured, before.captured + 1);
  EXPECT_EQ(backend.fill_tags().writes().copied, before.copied) << "nothing copied from a slot under capture";
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 5; ++k) fill(100 + 10 * static_cast<std::uint64_t>(round) + k);  // rewrite slots
    must(cudaMemsetAsync(log.device + recorded, 0, sizeof(FillTag), s));
    backend.launch_graph(graph, stream);
    must(cudaStreamSynchronize(s));
    EXPECT_EQ(log.read()[recorded].weights, 77u) << "replay " << round;
    EXPECT_NO_THROW(Backend::CallScope call(backend)) << "replay " << round << "'s check agrees";
  }
  const std::vector<FillTag> gathered = log.read();
  EXPECT_EQ(gathered[recorded - 1].weights, 1u);
  EXPECT_EQ(gathered[recorded + 1].weights, 100u);
  EXPECT_EQ(gathered[fake.tags_logged() - 1].weights, 124u);
  backend.destroy_graph(graph);
  backend.deallocate(send, kChunk);
  backend.deallocate(recv, 2 * kChunk);
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
    config.check_every_fill = true;  // the fill's own check, before the unpack
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
    const OwnedStream stream;
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

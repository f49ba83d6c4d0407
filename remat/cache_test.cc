// The cache against a backend that logs its ordering calls, so the GPU protocol is visible: a slot
// is refilled only after the side stream waited on every consumer's release event.
#include "remat/cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gtp::remat {
namespace {

Stream stream(int i) { return reinterpret_cast<Stream>(static_cast<std::intptr_t>(i)); }

class LoggingBackend : public Backend {
 public:
  std::string name() const override { return "logging"; }
  int group_size(int) const override { return 1; }
  int group_rank(int) const override { return 0; }
  void amax(const void*, kernels::SourceDtype, std::int64_t, std::int64_t, float*) override {}
  void pack(const kernels::WireSpec&, const kernels::PackArgs&) override {}
  void unpack(const kernels::WireSpec&, const kernels::GatheredChunks&, void*, std::int64_t) override {}
  void unpack_gemm(const kernels::WireSpec&, const kernels::GatheredChunks&, const kernels::GemmOutputs&) override {}
  void all_gather(int, const void*, void*, std::int64_t) override {}
  void all_reduce_max(int, float*, std::int64_t) override {}
  void reduce_scatter_mean(int, const float*, float*, std::int64_t) override {}
  void add(const float*, float*, std::int64_t) override {}
  void fill(void* dst, unsigned char byte, std::int64_t bytes) override { std::memset(dst, byte, bytes); }
  void host_callback(std::function<void()> callback) override { callback(); }
  Stream side_stream() override { return stream(99); }
  Event record(Stream s) override {
    recorded.emplace_back(++events, s);
    return events;
  }
  void wait(Stream s, Event e) override { waits.emplace_back(s, e); }
  void forget(Event e) override { forgotten.push_back(e); }

  Event events = 0;
  std::vector<std::pair<Event, Stream>> recorded;
  std::vector<std::pair<Stream, Event>> waits;
  std::vector<Event> forgotten;

 protected:
  void* do_allocate(std::int64_t bytes) override { return std::malloc(bytes); }
  void do_deallocate(void* ptr) override { std::free(ptr); }
};

TEST(Cache, AFreedSlotIsRefilledOnlyAfterTheSideStreamWaitedOnEveryRelease) {
  LoggingBackend backend;
  Cache cache(backend, CacheConfig{});
  const int slot = cache.take(1000, true);
  cache.slot(slot).state = Cache::State::kHeld;
  cache.slot(slot).consumers = 2;
  const Event first = backend.record(stream(1));
  const Event second = backend.record(stream(2));
  cache.release(slot, first);
  EXPECT_EQ(cache.slot(slot).state, Cache::State::kHeld);
  cache.release(slot, second);
  EXPECT_EQ(cache.slot(slot).state, Cache::State::kFree);
  EXPECT_TRUE(backend.waits.empty()) << "freeing must not wait: only the next filler does";
  const std::uint64_t generation = cache.slot(slot).generation;
  EXPECT_EQ(cache.take(500, true), slot);  // reused: same address, no allocation
  EXPECT_EQ(cache.slot(slot).generation, generation + 1);
  EXPECT_EQ(backend.waits, (std::vector<std::pair<Stream, Event>>{{stream(99), first}, {stream(99), second}}));
  EXPECT_EQ(backend.forgotten, (std::vector<Event>{first, second}));
  EXPECT_EQ(backend.memory().allocations, 1);
}

TEST(Cache, SlotsAreSizedForTheLargestCallAndGrowOnlyWhenALargerOneComes) {
  LoggingBackend backend;
  Cache cache(backend, CacheConfig{});
  const int a = cache.take(1000, true);
  cache.slot(a).state = Cache::State::kHeld;
  const int b = cache.take(3000, true);  // a is held: a new slot
  EXPECT_NE(a, b);
  cache.slot(b).state = Cache::State::kHeld;
  cache.slot(a).state = Cache::State::kFree;
  const int c = cache.take(3000, true);  // a grows to the largest size
  EXPECT_EQ(c, a);
  EXPECT_EQ(cache.slot(a).capacity, 3000);
  EXPECT_EQ(cache.stats().slot_bytes, 6000);
  EXPECT_EQ(backend.memory().allocations, 3);
  EXPECT_EQ(backend.memory().bytes_in_use, 6000);
}

TEST(Cache, TheBudgetDefersPrefetchesEvictsThemOnDemandAndRefusesWhenConsumersHoldIt) {
  LoggingBackend backend;
  CacheConfig config;
  config.budget_bytes = 2000;
  Cache cache(backend, config);
  const int held = cache.take(1000, true);
  cache.slot(held).state = Cache::State::kHeld;
  const int prefetched = cache.take(1000, false);
  ASSERT_GE(prefetched, 0);
  cache.slot(prefetched).state = Cache::State::kPrefetched;
  cache.slot(prefetched).chain = 0;
  cache.slot(prefetched).position = 3;
  EXPECT_EQ(cache.find_prefetched(0, 3), prefetched);
  EXPECT_EQ(cache.take(1000, false), -1);  // a prefetch waits
  EXPECT_EQ(cache.stats().budget_waits, 1);
  const int demanded = cache.take(1000, true);  // on demand: the prefetched slot is evicted
  EXPECT_EQ(demanded, prefetched);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.find_prefetched(0, 3), -1);
  cache.slot(demanded).state = Cache::State::kHeld;
  try {
    cache.take(1000, true);
    ADD_FAILURE() << "a full budget held by consumers must be refused";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("memory budget of 2000 bytes"), std::string::npos) << error.what();
  }
  EXPECT_LE(cache.stats().slot_bytes, config.budget_bytes);
}

TEST(Cache, PoisoningWaitsForTheReleasesThenFillsTheWholeSlot) {
  LoggingBackend backend;
  CacheConfig config;
  config.poison_released = true;
  Cache cache(backend, config);
  const int slot = cache.take(512, true);
  cache.slot(slot).state = Cache::State::kHeld;
  cache.slot(slot).consumers = 1;
  const Event release = backend.record(stream(1));
  cache.release(slot, release);
  EXPECT_EQ(backend.waits, (std::vector<std::pair<Stream, Event>>{{stream(99), release}}));
  const auto* bytes = static_cast<const unsigned char*>(cache.slot(slot).ptr);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(bytes[i], 0xFF);
}

}  // namespace
}  // namespace gtp::remat

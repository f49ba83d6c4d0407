// The cache against a backend that logs its ordering calls, so the GPU protocol is visible: a slot
// is refilled only after its next filling stream waited on every consumer's release event, on an
// unconsumed fill and on the poison, whichever side stream those ran on.
#include "remat/cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "testing/remat/logging_backend.h"

namespace gtp::remat {
namespace {

using testing::LoggingBackend;

Stream stream(int i) { return testing::consumer_stream(i); }
Stream gather0() { return stream(1000); }

TEST(Cache, AFreedSlotIsRefilledOnlyAfterTheSideStreamWaitedOnEveryRelease) {
  LoggingBackend backend;
  Cache cache(backend, CacheConfig{});
  const int slot = cache.take(1000, true, gather0());
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
  EXPECT_EQ(cache.take(500, true, gather0()), slot);  // reused: same address, no allocation
  EXPECT_EQ(cache.slot(slot).generation, generation + 1);
  EXPECT_EQ(backend.waits, (std::vector<std::pair<Stream, Event>>{{gather0(), first}, {gather0(), second}}));
  EXPECT_EQ(backend.forgotten, (std::vector<Event>{first, second}));
  EXPECT_EQ(backend.memory().allocations, 1);
}

TEST(Cache, SlotsAreSizedForTheLargestCallAndGrowOnlyWhenALargerOneComes) {
  LoggingBackend backend;
  Cache cache(backend, CacheConfig{});
  const int a = cache.take(1000, true, gather0());
  cache.slot(a).state = Cache::State::kHeld;
  const int b = cache.take(3000, true, gather0());  // a is held: a new slot
  EXPECT_NE(a, b);
  cache.slot(b).state = Cache::State::kHeld;
  cache.slot(a).state = Cache::State::kFree;
  const int c = cache.take(3000, true, gather0());  // a grows to the largest size
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
  config.name = "experts";
  Cache cache(backend, config);
  const int held = cache.take(1000, true, gather0());
  cache.slot(held).state = Cache::State::kHeld;
  const int prefetched = cache.take(1000, false, gather0());
  ASSERT_GE(prefetched, 0);
  cache.slot(prefetched).state = Cache::State::kPrefetched;
  cache.slot(prefetched).chain = 0;
  cache.slot(prefetched).position = 3;
  EXPECT_EQ(cache.find_prefetched(0, 3), prefetched);
  EXPECT_EQ(cache.take(1000, false, gather0()), -1);  // a prefetch waits
  EXPECT_EQ(cache.stats().budget_waits, 1);
  const int demanded = cache.take(1000, true, gather0());  // on demand: the prefetched slot is evicted
  EXPECT_EQ(demanded, prefetched);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.find_prefetched(0, 3), -1);
  cache.slot(demanded).state = Cache::State::kHeld;
  try {
    cache.take(1000, true, gather0());
    ADD_FAILURE() << "a full budget held by consumers must be refused";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("experts: memory budget of 2000 bytes"), std::string::npos)
        << error.what();
  }
  EXPECT_LE(cache.stats().slot_bytes, config.budget_bytes);
}

TEST(Cache, PeakBytesCountTheFilledSlotsAtOnce) {
  LoggingBackend backend;
  Cache cache(backend, CacheConfig{});
  const int a = cache.take(1000, true, gather0());
  cache.slot(a).state = Cache::State::kHeld;
  cache.slot(a).consumers = 1;
  EXPECT_EQ(cache.stats().peak_bytes, 1000);
  const int b = cache.take(1000, false, gather0());
  cache.slot(b).state = Cache::State::kPrefetched;
  EXPECT_EQ(cache.stats().peak_bytes, 2000);
  cache.release(a, backend.record(gather0()));
  cache.drop(b);
  const int c = cache.take(1000, true, gather0());  // one of the two free slots: one filled at a time
  cache.slot(c).state = Cache::State::kHeld;
  EXPECT_EQ(cache.stats().peak_bytes, 2000);
  EXPECT_EQ(cache.stats().slot_bytes, 2000) << "slots stay allocated; peak_bytes counts the filled ones";
}

TEST(Cache, PoisoningWaitsForTheReleasesThenFillsTheWholeSlot) {
  LoggingBackend backend(2);
  CacheConfig config;
  config.poison_released = true;
  Cache cache(backend, config);
  const int slot = cache.take(512, true, gather0());
  cache.slot(slot).state = Cache::State::kHeld;
  cache.slot(slot).consumers = 1;
  const Event release = backend.record(stream(1));
  cache.release(slot, release);
  EXPECT_EQ(backend.waits, (std::vector<std::pair<Stream, Event>>{{gather0(), release}}));
  EXPECT_EQ(backend.log.back(), "fill on ag0") << "the poison goes on the stream that filled the slot";
  const auto* bytes = static_cast<const unsigned char*>(cache.slot(slot).ptr);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(bytes[i], 0xFF);
  // Another group's gather stream refills it: it waits on the poison, not only on the release.
  const Stream gather1 = backend.side_stream(1, Role::kGather);
  EXPECT_EQ(cache.take(512, true, gather1), slot);
  EXPECT_EQ(backend.log.back(), "ag1 waits ag0");
}

TEST(Cache, AnUnconsumedFillIsWaitedOnByTheNextFillerOfAnotherStream) {
  LoggingBackend backend(2);
  Cache cache(backend, CacheConfig{});
  const int slot = cache.take(256, false, gather0());
  cache.slot(slot).state = Cache::State::kPrefetched;
  cache.slot(slot).ready = backend.record(gather0());  // the prefetch's gather and unpack
  const Event fill = cache.slot(slot).ready;
  cache.drop(slot);
  EXPECT_EQ(cache.slot(slot).ready, 0u);
  const Stream gather1 = backend.side_stream(1, Role::kGather);
  EXPECT_EQ(cache.take(256, true, gather1), slot);
  EXPECT_EQ(backend.waits, (std::vector<std::pair<Stream, Event>>{{gather1, fill}}));
  EXPECT_EQ(cache.slot(slot).filler, gather1);
}

}  // namespace
}  // namespace gtp::remat

// The fill-tag ring's bookkeeping (fill_tag_ring.h), no CUDA: the release words stand in for the
// mapped memory the check kernel writes, a flag per slot for its event.
#include "remat/fill_tag_ring.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace gtp::remat {
namespace {

struct Device {
  std::vector<std::uint64_t> words;
  std::vector<bool> events_done;
  explicit Device(int slots) : words(static_cast<std::size_t>(slots), 0), events_done(static_cast<std::size_t>(slots)) {}
  int acquire(FillTagRing& ring) {
    return ring.acquire(words.data(), [&](int s) { return static_cast<bool>(events_done[static_cast<std::size_t>(s)]); });
  }
};

TEST(FillTagRing, SlotsGoInOrderAndNoneIsReusedBeforeItsCheckReleasedIt) {
  FillTagRing ring(3);
  Device device(3);
  std::vector<std::uint64_t> seqs;
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(device.acquire(ring), k);
    seqs.push_back(ring.commit(k));
  }
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{1, 2, 3}));
  // Every slot copied from and none checked: the next fill must write its tag another way.
  EXPECT_EQ(device.acquire(ring), -1);
  EXPECT_EQ(device.acquire(ring), -1) << "asking again neither waits nor moves on";
  // A later slot's release does not free the head: slots are reused in order.
  device.words[1] = seqs[1];
  EXPECT_EQ(device.acquire(ring), -1);
  device.words[0] = seqs[0];
  ASSERT_EQ(device.acquire(ring), 0);
  EXPECT_EQ(device.acquire(ring), 0) << "acquire without commit hands out the same slot";
  const std::uint64_t again = ring.commit(0);
  EXPECT_EQ(again, 4u);
  ASSERT_EQ(device.acquire(ring), 1);  // released above
  ring.commit(1);
  EXPECT_EQ(device.acquire(ring), -1);  // slot 2 (seq 3) not yet released
}

TEST(FillTagRing, AStaleReleaseWordFreesNothing) {
  FillTagRing ring(1);
  Device device(1);
  ASSERT_EQ(device.acquire(ring), 0);
  const std::uint64_t first = ring.commit(0);
  device.words[0] = first;
  ASSERT_EQ(device.acquire(ring), 0);
  const std::uint64_t second = ring.commit(0);
  ASSERT_GT(second, first);
  // The word still holds the first use's number (the second check has not run): not free.
  EXPECT_EQ(device.acquire(ring), -1);
  device.words[0] = second;
  EXPECT_EQ(device.acquire(ring), 0);
}

TEST(FillTagRing, AFreshRingIsFreeAndANeverUsedWordReleasesNoUse) {
  FillTagRing ring(2);
  Device device(2);
  EXPECT_EQ(ring.gate(0), FillTagRing::Gate::kFree);
  ASSERT_EQ(device.acquire(ring), 0);
  EXPECT_GE(ring.commit(0), 1u) << "sequence numbers start above the words' initial 0";
  ASSERT_EQ(device.acquire(ring), 1);
  ring.commit(1);
  EXPECT_EQ(device.acquire(ring), -1);
}

TEST(FillTagRing, AnAbandonedSlotWaitsForItsEventNotItsWord) {
  FillTagRing ring(2);
  Device device(2);
  ASSERT_EQ(device.acquire(ring), 0);
  const std::uint64_t seq = ring.commit(0);
  ring.by_event(0);  // its batch was cancelled: no check kernel
  ASSERT_EQ(device.acquire(ring), 1);
  ring.commit(1);
  device.words[1] = ring.seq(1);
  device.words[0] = seq;  // even a matching word does not free an event-gated slot
  EXPECT_EQ(device.acquire(ring), -1);
  device.events_done[0] = true;
  EXPECT_EQ(device.acquire(ring), 0);
  EXPECT_EQ(ring.gate(0), FillTagRing::Gate::kFree);
}

TEST(FillTagRing, LostSlotsAreSteppedOverAndAllLostGivesNone) {
  FillTagRing ring(3);
  Device device(3);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(device.acquire(ring), k);
    ring.commit(k);
  }
  ring.lose(0);
  ring.lose(0);  // counted once
  EXPECT_EQ(ring.lost(), 1);
  device.words[1] = ring.seq(1);
  EXPECT_EQ(device.acquire(ring), 1) << "the lost head is skipped";
  ring.commit(1);
  device.words[1] = ring.seq(1);
  device.words[2] = ring.seq(2);
  ASSERT_EQ(device.acquire(ring), 2);
  ring.commit(2);
  device.words[2] = ring.seq(2);
  EXPECT_EQ(device.acquire(ring), 1) << "0 is lost for good";
  ring.lose(1);
  ring.lose(2);
  EXPECT_EQ(device.acquire(ring), -1);
  EXPECT_EQ(ring.lost(), 3);
}

TEST(FillTagRing, CommitOnlyTheAcquiredSlot) {
  FillTagRing ring(2);
  Device device(2);
  EXPECT_THROW(ring.commit(1), std::logic_error);
  ASSERT_EQ(device.acquire(ring), 0);
  ring.commit(0);
  EXPECT_THROW(ring.commit(0), std::logic_error);
  EXPECT_THROW(FillTagRing(0), std::invalid_argument);
}

// Many uses with the device completing out of step: a slot is handed out only when the word of its
// latest use says so, and every use gets a fresh number.
TEST(FillTagRing, UnderChurnASlotIsNeverHandedOutWhileItsLatestUseIsUnreleased) {
  constexpr int kSlots = 5;
  FillTagRing ring(kSlots);
  Device device(kSlots);
  std::vector<std::uint64_t> in_flight(kSlots, 0);  // the unreleased use of each slot; 0: none
  std::uint64_t last = 0;
  int fallbacks = 0;
  for (int step = 0; step < 1000; ++step) {
    if (step % 3 != 0) {  // the device runs the oldest check now and then
      for (int s = 0; s < kSlots; ++s) {
        if (in_flight[s] != 0 && (step + s) % 4 == 0) {
          device.words[s] = in_flight[s];
          in_flight[s] = 0;
        }
      }
    }
    const int slot = device.acquire(ring);
    if (slot < 0) {
      ++fallbacks;
      continue;
    }
    ASSERT_EQ(in_flight[slot], 0u) << "slot " << slot << " handed out at step " << step << " before its release";
    const std::uint64_t seq = ring.commit(slot);
    ASSERT_GT(seq, last);
    last = seq;
    in_flight[slot] = seq;
  }
  EXPECT_GT(fallbacks, 0);
  EXPECT_GT(last, 100u);
}

}  // namespace
}  // namespace gtp::remat

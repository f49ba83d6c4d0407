#include "remat/chain.h"

#include <gtest/gtest.h>

namespace gtp::remat {
namespace {

TEST(Chain, RecordsTheFirstStepThenVerifiesEveryConsume) {
  Chain chain;
  for (WeightId id : {0, 1, 2}) EXPECT_FALSE(chain.consume({id}).verified);
  EXPECT_TRUE(chain.recording());
  chain.end_step();
  EXPECT_FALSE(chain.recording());
  EXPECT_EQ(chain.length(), 3);
  EXPECT_EQ(chain.position(), 0);  // the head, across the step boundary
  for (WeightId id : {0, 1, 2}) {
    const Chain::Consume consumed = chain.consume({id});
    EXPECT_TRUE(consumed.verified);
    EXPECT_EQ(consumed.position, id);
  }
  EXPECT_EQ(chain.position(), chain.length()) << "nothing is left of the step";
  chain.end_step();
  EXPECT_EQ(chain.mismatches(), 0);
}

TEST(Chain, SkippedEntriesResynchroniseAndExtraEntriesKeepThePosition) {
  Chain chain;
  for (WeightId id : {0, 1, 2, 3}) chain.consume({id});
  chain.end_step();
  EXPECT_TRUE(chain.consume({0}).verified);
  const Chain::Consume skipped = chain.consume({2});  // 1 was skipped
  EXPECT_FALSE(skipped.verified);
  EXPECT_EQ(skipped.position, 2);
  EXPECT_EQ(chain.last_mismatch(), "expected weights [1] at position 1 of 4, got [2]");
  const Chain::Consume extra = chain.consume({7, 8});  // never recorded
  EXPECT_FALSE(extra.verified);
  EXPECT_EQ(extra.position, -1);
  EXPECT_EQ(chain.position(), 3);
  EXPECT_TRUE(chain.consume({3}).verified);
  chain.end_step();
  EXPECT_EQ(chain.mismatches(), 2);
}

TEST(Chain, AStepThatEndsEarlyIsAMismatchAndResetRecordsAgain) {
  Chain chain;
  for (WeightId id : {4, 5}) chain.consume({id});
  chain.end_step();
  chain.consume({4});
  chain.end_step();
  EXPECT_EQ(chain.mismatches(), 1);
  EXPECT_EQ(chain.last_mismatch(), "step ended at position 1 of 2");
  chain.reset();
  EXPECT_TRUE(chain.recording());
  EXPECT_EQ(chain.length(), 0);
  chain.end_step();  // an empty recording stays open
  EXPECT_TRUE(chain.recording());
}

TEST(Chain, TheSameWeightsInAnotherLayoutAreAnotherEntry) {
  Chain chain;
  chain.consume(ChainKey({0}, Layout::kGemm));
  chain.consume({0});
  chain.end_step();
  EXPECT_EQ(chain.length(), 2);
  EXPECT_TRUE(chain.consume(ChainKey({0}, Layout::kGemm)).verified);
  EXPECT_FALSE(chain.consume(ChainKey({0}, Layout::kGemm)).verified);
  EXPECT_EQ(chain.last_mismatch(), "expected weights [0] at position 1 of 2, got [0] as gemm");
}

}  // namespace
}  // namespace gtp::remat

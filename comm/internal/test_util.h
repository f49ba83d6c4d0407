// Test helpers shared by the comm tests.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"

namespace gtp::comm::internal {

// Runs one function per rank on its own thread and returns what each threw.
inline std::vector<std::exception_ptr> run_ranks(int world_size, const std::function<void(int rank)>& body) {
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

// Rethrows the first error, so a test can EXPECT_NO_THROW on a whole job.
inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Exercises every collective of `bootstrap` and checks the results; used for all implementations.
inline void exercise_bootstrap(Bootstrap& bootstrap) {
  const int n = bootstrap.world_size();
  const int rank = bootstrap.rank();
  std::vector<int> gathered(3 * n);
  const int mine[3] = {rank, rank * 10, -rank};
  bootstrap.allgather(mine, gathered.data(), sizeof(mine));
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(gathered[3 * r], r);
    ASSERT_EQ(gathered[3 * r + 1], r * 10);
    ASSERT_EQ(gathered[3 * r + 2], -r);
  }
  for (int root = 0; root < n; ++root) {
    std::string text = rank == root ? "from root " + std::to_string(root) : std::string(12, '?');
    text.resize(12);
    bootstrap.broadcast(text.data(), text.size(), root);
    std::string expected = "from root " + std::to_string(root);
    expected.resize(12);
    ASSERT_EQ(text, expected);
  }
  bootstrap.barrier();
  bootstrap.allgather(nullptr, nullptr, 0);  // zero bytes: legal, with null buffers
  const std::vector<std::string> records = bootstrap.allgather_records(std::string(rank * 7 + 1, 'a' + rank));
  ASSERT_EQ(records.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(records[r], std::string(r * 7 + 1, 'a' + r));
}

}  // namespace gtp::comm::internal

// Checks of HostComm collectives against a single-process reference, shared by the in-process test and
// the multi-process workers. Every rank generates the inputs of ALL ranks from the same seed, so each
// can compute the reference locally; data are random, never zeros.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "comm/errors.h"
#include "comm/host.h"
#include "comm/internal/bf16.h"

namespace gtp::comm::internal {

inline std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<float> out(count);
  for (float& x : out) x = value(rng);
  return out;
}

inline void check_all_gather(HostComm& comm, std::uint64_t seed) {
  const int n = comm.size();
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4096},
                            std::size_t{(1 << 20) + 3}}) {
    std::mt19937_64 rng(seed + bytes);
    std::vector<unsigned char> everyone(bytes * n);
    for (auto& byte : everyone) byte = static_cast<unsigned char>(rng());
    std::vector<unsigned char> gathered(bytes * n, 0);
    comm.all_gather(everyone.data() + comm.rank() * bytes, gathered.data(), bytes);
    EXPECT_EQ(gathered, everyone) << "all_gather of " << bytes << " bytes per rank";
  }
}

inline void check_reduce_scatter(HostComm& comm, std::uint64_t seed, HostDataType type, HostReduceOp op) {
  const int n = comm.size();
  const bool bf16 = type == HostDataType::kBFloat16;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}, std::size_t{65537}}) {
    // inputs[r] is rank r's send buffer: n chunks of `count` values.
    std::vector<std::vector<float>> inputs(n);
    for (int r = 0; r < n; ++r) {
      inputs[r] = random_floats(count * n, seed + 7919 * r + count);
      if (bf16) {
        for (float& x : inputs[r]) x = bf16_to_float(float_to_bf16(x));
      }
    }
    std::vector<std::uint16_t> send_bf16(count * n), recv_bf16(count);
    std::vector<float> recv_fp32(count);
    for (std::size_t i = 0; i < count * n; ++i) send_bf16[i] = float_to_bf16(inputs[comm.rank()][i]);
    comm.reduce_scatter(bf16 ? static_cast<const void*>(send_bf16.data()) : inputs[comm.rank()].data(),
                        bf16 ? static_cast<void*>(recv_bf16.data()) : recv_fp32.data(), count, type, op);
    int wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double reference = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        reference += inputs[r][comm.rank() * count + i];
        magnitude += std::fabs(inputs[r][comm.rank() * count + i]);
      }
      if (op == HostReduceOp::kMean) {
        reference /= n;
        magnitude /= n;
      }
      const double got = bf16 ? bf16_to_float(recv_bf16[i]) : recv_fp32[i];
      // FP32 accumulation error, plus one BF16 rounding of the result.
      const double tolerance = n * magnitude * std::ldexp(1.0, -23) + (bf16 ? std::fabs(reference) / 256 : 0) + 1e-30;
      if (std::fabs(got - reference) > tolerance && ++wrong <= 3) {
        ADD_FAILURE() << "reduce_scatter count " << count << " element " << i << ": got " << got << ", expected "
                      << reference;
      }
    }
    EXPECT_EQ(wrong, 0) << "reduce_scatter count " << count;
  }
}

inline void check_all_reduce_max(HostComm& comm, std::uint64_t seed) {
  const int n = comm.size();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n - 1),
                            static_cast<std::size_t>(n + 1), std::size_t{1000}, std::size_t{100003}}) {
    std::vector<std::vector<float>> inputs(n);
    for (int r = 0; r < n; ++r) inputs[r] = random_floats(count, seed + 104729 * r + count);
    // One NaN, contributed by the last rank only, must win at its position.
    const std::size_t nan_at = count / 2;
    if (count > 0) inputs[n - 1][nan_at] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> data = inputs[comm.rank()];
    comm.all_reduce_max(data.data(), count);
    for (std::size_t i = 0; i < count; ++i) {
      if (i == nan_at) {
        EXPECT_TRUE(std::isnan(data[i])) << "all_reduce_max count " << count << ": the NaN was lost";
        continue;
      }
      float reference = inputs[0][i];
      for (int r = 1; r < n; ++r) reference = std::max(reference, inputs[r][i]);
      if (data[i] != reference) {
        ADD_FAILURE() << "all_reduce_max count " << count << " element " << i << ": got " << data[i] << ", expected "
                      << reference;
        break;
      }
    }
  }
}

// Every rank but the last passes `count` elements, the last `count + 1`: every rank must throw
// std::invalid_argument naming the sizes.
inline void check_mismatched_reduce_scatter_fails(HostComm& comm) {
  const std::size_t count = comm.rank() == comm.size() - 1 ? 101 : 100;
  std::vector<float> send(count * comm.size(), 1.0f), recv(count);
  try {
    comm.reduce_scatter(send.data(), recv.data(), count, HostDataType::kFloat32, HostReduceOp::kSum);
    ADD_FAILURE() << "reduce_scatter with mismatched counts returned on rank " << comm.rank();
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("sent 40"), std::string::npos) << message;
    EXPECT_NE(message.find("same counts and types"), std::string::npos) << message;
  }
  // The communicator is now unusable, and says so.
  EXPECT_THROW(comm.barrier(), CommError);
}

}  // namespace gtp::comm::internal

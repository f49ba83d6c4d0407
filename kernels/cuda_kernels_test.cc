// CUDA kernels against the CPU reference, bit for bit, on fresh random inputs with planted edge
// cases. Every output buffer is filled with two different poisons in two runs: a byte the kernel
// did not write would differ between them (and from the reference).
#include "kernels/cuda_kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/internal/test_data.h"
#include "kernels/reference.h"

namespace gtp::kernels {
namespace {

using testing::AlignedBytes;
using testing::kAllSpecs;
using testing::name;
using testing::EdgeCases;
using testing::random_weight;
using testing::shard_bytes;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes ? bytes : 16) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  void upload(const void* host, size_t n) { cudaMemcpy(ptr_, host, n, cudaMemcpyHostToDevice); }
  void fill(uint8_t value) { cudaMemset(ptr_, value, bytes_); }
  std::vector<uint8_t> download(size_t n) const {
    std::vector<uint8_t> out(n);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), ptr_, n, cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

struct Shape {
  int64_t rows, cols, G;
};
// Ragged rows (padding inside and across shards), odd tile counts, an odd number of 16-element
// groups per row with a multi-lane team (208 columns: the last NVFP4 group has no partner lane),
// and one large shard, which stays last.
const Shape kShapes[] = {{1000, 128, 8}, {333, 96, 3}, {31, 32, 4}, {96, 48, 1}, {64, 160, 1},
                         {50, 208, 2}, {4096, 1024, 2}};

// GTP_KERNEL_TEST_QUICK=1 drops the large shape (for compute-sanitizer runs, which are slow).
std::vector<Shape> shapes() {
  const char* quick = std::getenv("GTP_KERNEL_TEST_QUICK");
  const size_t all = sizeof(kShapes) / sizeof(kShapes[0]);
  const size_t n = (quick && quick[0] == '1') ? all - 1 : all;
  return std::vector<Shape>(kShapes, kShapes + n);
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// Packs every shard on the GPU and the CPU; returns the reference gathered bytes.
struct Packed {
  WeightGeometry geometry;
  ChunkLayout layout;
  std::vector<uint8_t> reference;
};

Packed pack_and_compare(const WireSpec& spec, const Shape& s, SourceDtype dtype, bool shared_amax,
                        const EdgeCases& edges, uint64_t seed) {
  Packed p;
  const auto w = random_weight(s.rows, s.cols, seed, edges);
  p.geometry = weight_geometry(spec.format, s.rows, s.cols, s.G);
  p.layout = chunk_layout(spec, p.geometry.shard_rows, s.cols);
  p.reference.resize(p.layout.chunk_bytes * s.G);
  float amax = 0;
  for (float x : w) if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  amax = codec::bf16_to_float(codec::float_to_bf16(amax)) * 0.75f;  // exercise saturation too
  DeviceBuffer d_amax(sizeof(float));
  d_amax.upload(&amax, sizeof amax);
  for (int64_t rank = 0; rank < s.G; ++rank) {
    const int64_t valid = p.geometry.valid_rows(rank);
    AlignedBytes shard = shard_bytes(w, s.cols, rank * p.geometry.shard_rows, valid, dtype);
    AlignedBytes ref_chunk(p.layout.chunk_bytes);
    PackArgs a;
    a.src_dtype = dtype;
    a.shard_rows = p.geometry.shard_rows;
    a.valid_rows = valid;
    a.cols = s.cols;
    a.chunk_capacity = p.layout.chunk_bytes;
    a.shard = shard.data();
    a.chunk = ref_chunk.data();
    a.amax = shared_amax ? &amax : nullptr;
    pack_reference(spec, a);
    std::memcpy(p.reference.data() + rank * p.layout.chunk_bytes, ref_chunk.data(),
                p.layout.chunk_bytes);

    DeviceBuffer d_shard(shard.size()), d_chunk(p.layout.chunk_bytes);
    d_shard.upload(shard.data(), shard.size());
    a.shard = d_shard.get();
    a.chunk = d_chunk.get();
    a.amax = shared_amax ? reinterpret_cast<float*>(d_amax.get()) : nullptr;
    for (uint8_t poison : {0xA5, 0x5A}) {
      d_chunk.fill(poison);
      pack_cuda(spec, a, nullptr);
      const std::vector<uint8_t> got = d_chunk.download(p.layout.chunk_bytes);
      for (int64_t i = 0; i < p.layout.chunk_bytes; ++i) {
        if (got[i] != ref_chunk.data()[i]) {
          ADD_FAILURE() << name(spec) << " pack rows=" << s.rows << " G=" << s.G << " rank "
                        << rank << " byte " << i << " (data " << p.layout.data_bytes
                        << ", scales at " << p.layout.scales_offset << ", scalars at "
                        << p.layout.scalars_offset << "): gpu " << int(got[i]) << " cpu "
                        << int(ref_chunk.data()[i]) << " poison " << int(poison);
          return p;
        }
      }
    }
  }
  return p;
}

void compare_unpack(const WireSpec& spec, const Packed& p) {
  DeviceBuffer d_chunks(p.reference.size());
  d_chunks.upload(p.reference.data(), p.reference.size());
  AlignedBytes host_chunks(p.reference.size());
  std::memcpy(host_chunks.data(), p.reference.data(), p.reference.size());
  const int64_t out_bytes = p.geometry.rows * p.geometry.cols * 2;
  AlignedBytes ref_out(out_bytes);
  unpack_reference(spec, {host_chunks.data(), static_cast<int64_t>(p.reference.size()), p.geometry},
                   ref_out.data(), out_bytes);
  DeviceBuffer d_out(out_bytes);
  const GatheredChunks in{d_chunks.get(), static_cast<int64_t>(p.reference.size()), p.geometry};
  for (uint8_t poison : {0xA5, 0x5A}) {
    d_out.fill(poison);
    unpack_cuda(spec, in, d_out.get(), out_bytes, nullptr);
    const std::vector<uint8_t> got = d_out.download(out_bytes);
    ASSERT_EQ(std::memcmp(got.data(), ref_out.data(), out_bytes), 0)
        << name(spec) << " unpack rows=" << p.geometry.rows << " G=" << p.geometry.group_size;
  }
  if (spec.format == WireFormat::kBF16) return;

  const GemmLayoutSizes sizes = gemm_layout_sizes(spec, p.geometry);
  const int64_t G = p.geometry.group_size;
  AlignedBytes r_data(sizes.data_bytes), r_scales(sizes.scales_bytes + 16);
  AlignedBytes r_data_t(sizes.transposed_data_bytes + 16), r_scales_t(sizes.transposed_scales_bytes + 16);
  std::vector<float> r_decode(G);
  GemmOutputs ref{r_data.data(), sizes.data_bytes, r_scales.data(), sizes.scales_bytes,
                  sizes.transpose_supported ? r_data_t.data() : nullptr,
                  sizes.transposed_data_bytes, r_scales_t.data(), sizes.transposed_scales_bytes,
                  r_decode.data(), G};
  unpack_gemm_reference(spec, {host_chunks.data(), static_cast<int64_t>(p.reference.size()),
                               p.geometry}, ref);
  DeviceBuffer d_data(sizes.data_bytes), d_scales(sizes.scales_bytes + 16);
  DeviceBuffer d_data_t(sizes.transposed_data_bytes + 16), d_scales_t(sizes.transposed_scales_bytes + 16);
  DeviceBuffer d_decode(G * sizeof(float));
  GemmOutputs dev{d_data.get(), sizes.data_bytes, d_scales.get(), sizes.scales_bytes,
                  sizes.transpose_supported ? d_data_t.get() : nullptr,
                  sizes.transposed_data_bytes, d_scales_t.get(), sizes.transposed_scales_bytes,
                  reinterpret_cast<float*>(d_decode.get()), G};
  for (uint8_t poison : {0xA5, 0x5A}) {
    for (DeviceBuffer* b : {&d_data, &d_scales, &d_data_t, &d_scales_t, &d_decode}) b->fill(poison);
    unpack_gemm_cuda(spec, in, dev, nullptr);
    auto same = [&](const DeviceBuffer& d, const uint8_t* r, int64_t n, const char* what) {
      const std::vector<uint8_t> got = d.download(n);
      EXPECT_EQ(std::memcmp(got.data(), r, n), 0)
          << name(spec) << " gemm " << what << " rows=" << p.geometry.rows << " G=" << G;
    };
    same(d_data, r_data.data(), sizes.data_bytes, "data");
    same(d_scales, r_scales.data(), sizes.scales_bytes, "scales");
    if (sizes.transpose_supported) {
      same(d_data_t, r_data_t.data(), sizes.transposed_data_bytes, "transposed data");
      same(d_scales_t, r_scales_t.data(), sizes.transposed_scales_bytes, "transposed scales");
    }
    same(d_decode, reinterpret_cast<const uint8_t*>(r_decode.data()),
         sizes.decode_scale_count * sizeof(float), "decode scales");
  }
}

TEST_F(CudaKernels, PackAndUnpackMatchTheReferenceBitForBit) {
  std::mt19937_64 seeds(std::random_device{}());
  for (const WireSpec& spec : kAllSpecs) {
    for (const Shape& s : shapes()) {
      if (s.cols % column_multiple(spec.format) != 0) continue;  // not a valid weight for it
      for (SourceDtype dtype : {SourceDtype::kBF16, SourceDtype::kFP32}) {
        for (bool shared : {false, true}) {
          const uint64_t seed = seeds();
          SCOPED_TRACE(name(spec) + " seed " + std::to_string(seed));
          const Packed p = pack_and_compare(spec, s, dtype, shared, EdgeCases{}, seed);
          compare_unpack(spec, p);
        }
      }
    }
  }
}

TEST_F(CudaKernels, NonFiniteInputsMatchTheReference) {
  std::mt19937_64 seeds(std::random_device{}());
  EdgeCases edges;
  edges.non_finite = true;
  for (const WireSpec& spec : kAllSpecs) {
    for (const Shape& s : shapes()) {
      if (s.cols % column_multiple(spec.format) != 0) continue;
      const uint64_t seed = seeds();
      SCOPED_TRACE(name(spec) + " seed " + std::to_string(seed));
      const Packed p = pack_and_compare(spec, s, SourceDtype::kFP32, false, edges, seed);
      compare_unpack(spec, p);
    }
  }
}

TEST_F(CudaKernels, AmaxMatchesTheReference) {
  for (SourceDtype dtype : {SourceDtype::kBF16, SourceDtype::kFP32}) {
    EdgeCases edges;
    edges.non_finite = true;
    const auto w = random_weight(777, 64, std::random_device{}(), edges);
    AlignedBytes host = shard_bytes(w, 64, 0, 777, dtype);
    DeviceBuffer d(host.size()), d_amax(4);
    d.upload(host.data(), host.size());
    amax_cuda(d.get(), dtype, 777, 64, reinterpret_cast<float*>(d_amax.get()), nullptr);
    const std::vector<uint8_t> got = d_amax.download(4);
    float amax;
    std::memcpy(&amax, got.data(), 4);
    EXPECT_EQ(amax, amax_reference(host.data(), dtype, 777, 64)) << to_string(dtype);
  }
}

// Argument checks run on the host before anything touches CUDA: they hold without a GPU too.
TEST(CudaKernelArguments, BadInputIsRefusedBeforeAnyLaunch) {
  PackArgs a;
  a.shard_rows = 32;
  a.valid_rows = 32;
  a.cols = 32;
  EXPECT_THROW(pack_cuda({WireFormat::kMXFP8}, a, nullptr), std::invalid_argument);
  alignas(16) static uint8_t buffer[64];
  a.shard = buffer + 1;
  a.chunk = buffer;
  a.chunk_capacity = 1 << 20;
  try {
    pack_cuda({WireFormat::kFP8}, a, nullptr);
    ADD_FAILURE() << "misaligned shard accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not 16-byte aligned"), std::string::npos) << e.what();
  }
  const WeightGeometry g = weight_geometry(WireFormat::kFP8, 64, 64, 2);
  EXPECT_THROW(unpack_cuda({WireFormat::kFP8}, {buffer, 64, g}, buffer, 1 << 20, nullptr),
               std::invalid_argument);
  EXPECT_THROW(amax_cuda(buffer, SourceDtype::kBF16, 4, 0, nullptr, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace gtp::kernels

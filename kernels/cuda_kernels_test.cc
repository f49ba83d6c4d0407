// CUDA kernels against the CPU reference, bit for bit, on fresh random inputs with planted edge
// cases. Every output buffer is filled with two different poisons in two runs: a byte the kernel
// did not write would differ between them (and from the reference).
#include "kernels/cuda_kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
// several transpose tiles each way with ragged last tiles and shard boundaries inside tiles
// (600 x 400, G=3: 208-row shards, 608 GEMM rows; 600 x 416 the same in 32-multiples, for the
// NVFP4 transpose's whole 16-byte pieces), and one large shard, which stays last.
const Shape kShapes[] = {{1000, 128, 8}, {333, 96, 3}, {31, 32, 4}, {96, 48, 1}, {64, 160, 1},
                         {50, 208, 2}, {600, 400, 3}, {600, 416, 3}, {4096, 1024, 2}};

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

// unpack_gemm_cuda against unpack_gemm_reference in the scale layout of `sizes`, every output byte,
// over two different poisons (so bytes left unwritten cannot match by chance).
void compare_unpack_gemm(const WireSpec& spec, const Packed& p, const AlignedBytes& host_chunks,
                         const GatheredChunks& in, const GemmLayoutSizes& sizes) {
  const int64_t G = p.geometry.group_size;
  AlignedBytes r_data(sizes.data_bytes), r_scales(sizes.scales_bytes + 16);
  AlignedBytes r_data_t(sizes.transposed_data_bytes + 16), r_scales_t(sizes.transposed_scales_bytes + 16);
  std::vector<float> r_decode(G);
  GemmOutputs ref{r_data.data(), sizes.data_bytes, r_scales.data(), sizes.scales_bytes,
                  sizes.transpose_supported ? r_data_t.data() : nullptr,
                  sizes.transposed_data_bytes, r_scales_t.data(), sizes.transposed_scales_bytes,
                  r_decode.data(), G, sizes.scale_layout};
  unpack_gemm_reference(spec, {host_chunks.data(), static_cast<int64_t>(p.reference.size()),
                               p.geometry}, ref);
  DeviceBuffer d_data(sizes.data_bytes), d_scales(sizes.scales_bytes + 16);
  DeviceBuffer d_data_t(sizes.transposed_data_bytes + 16), d_scales_t(sizes.transposed_scales_bytes + 16);
  DeviceBuffer d_decode(G * sizeof(float));
  GemmOutputs dev{d_data.get(), sizes.data_bytes, d_scales.get(), sizes.scales_bytes,
                  sizes.transpose_supported ? d_data_t.get() : nullptr,
                  sizes.transposed_data_bytes, d_scales_t.get(), sizes.transposed_scales_bytes,
                  reinterpret_cast<float*>(d_decode.get()), G, sizes.scale_layout};
  for (uint8_t poison : {0xA5, 0x5A}) {
    for (DeviceBuffer* b : {&d_data, &d_scales, &d_data_t, &d_scales_t, &d_decode}) b->fill(poison);
    unpack_gemm_cuda(spec, in, dev, nullptr);
    // `guard` bytes past the section were allocated too: they must still hold the poison.
    auto same = [&](const DeviceBuffer& d, const uint8_t* r, int64_t n, const char* what,
                    int64_t guard = 0) {
      const std::vector<uint8_t> got = d.download(n + guard);
      EXPECT_EQ(std::memcmp(got.data(), r, n), 0)
          << name(spec) << " gemm (" << to_string(sizes.scale_layout) << " scales) " << what
          << " rows=" << p.geometry.rows << " G=" << G;
      for (int64_t i = n; i < n + guard; ++i) {
        ASSERT_EQ(got[i], poison) << name(spec) << " gemm (" << to_string(sizes.scale_layout)
                                  << " scales) wrote past the end of " << what << " at byte " << i;
      }
    };
    same(d_data, r_data.data(), sizes.data_bytes, "data");
    same(d_scales, r_scales.data(), sizes.scales_bytes, "scales", 16);
    if (sizes.transpose_supported) {
      same(d_data_t, r_data_t.data(), sizes.transposed_data_bytes, "transposed data", 16);
      same(d_scales_t, r_scales_t.data(), sizes.transposed_scales_bytes, "transposed scales", 16);
    }
    same(d_decode, reinterpret_cast<const uint8_t*>(r_decode.data()),
         sizes.decode_scale_count * sizeof(float), "decode scales");
  }
}

// unpack_cuda, then the GEMM layout in each scale layout, against the CPU reference for one packed weight.
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

  // The GEMM layout, with row-major and (formats with block scales) blocked 128x4 scales.
  for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kBlocked128x4}) {
    const GemmLayoutSizes sizes = gemm_layout_sizes(spec, p.geometry, layout);
    if (layout == ScaleLayout::kBlocked128x4 && sizes.scale_rows == 0) continue;
    compare_unpack_gemm(spec, p, host_chunks, in, sizes);
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

// Shapes with and without a tail that fills no 16-byte vector (13 x 37, 1 x 5), with NaN and Inf
// present (skipped by the amax), and the largest magnitude planted in the tail.
TEST_F(CudaKernels, AmaxMatchesTheReference) {
  const std::pair<int64_t, int64_t> shapes[] = {{777, 64}, {13, 37}, {1, 5}, {4096, 1024}};
  std::mt19937_64 seeds(std::random_device{}());
  for (SourceDtype dtype : {SourceDtype::kBF16, SourceDtype::kFP32}) {
    for (const auto& [rows, cols] : shapes) {
      for (bool largest_in_tail : {false, true}) {
        EdgeCases edges;
        edges.non_finite = true;
        const uint64_t seed = seeds();
        auto w = random_weight(rows, cols, seed, edges);
        // Above the planted huge values (3.3e38) in FP32 and after rounding to BF16 (3.376e38).
        if (largest_in_tail) w.back() = -3.38e38f;
        AlignedBytes host = shard_bytes(w, cols, 0, rows, dtype);
        DeviceBuffer d(host.size()), d_amax(4);
        d.upload(host.data(), host.size());
        amax_cuda(d.get(), dtype, rows, cols, reinterpret_cast<float*>(d_amax.get()), nullptr);
        const std::vector<uint8_t> got = d_amax.download(4);
        float amax;
        std::memcpy(&amax, got.data(), 4);
        EXPECT_EQ(amax, amax_reference(host.data(), dtype, rows, cols))
            << to_string(dtype) << " " << rows << "x" << cols << " seed " << seed;
        if (largest_in_tail) {
          EXPECT_GE(amax, 3.37e38f) << to_string(dtype) << " " << rows << "x" << cols;
        }
      }
    }
  }
}

// ---- unpack_many_cuda: many weights of one wire in one launch per kUnpackJobsPerLaunch jobs.

// The G gathered chunks of a random weight, packed by the CPU reference (pack_cuda is held to it
// by the tests above).
struct GatheredWeight {
  WeightGeometry geometry;
  std::vector<uint8_t> chunks;
};

GatheredWeight gathered_reference(const WireSpec& spec, const Shape& s, const EdgeCases& edges,
                                  bool shared_amax, uint64_t seed) {
  GatheredWeight g;
  const auto w = random_weight(s.rows, s.cols, seed, edges);
  g.geometry = weight_geometry(spec.format, s.rows, s.cols, s.G);
  const ChunkLayout layout = chunk_layout(spec, g.geometry.shard_rows, s.cols);
  g.chunks.resize(layout.chunk_bytes * s.G);
  float amax = 0;
  for (float x : w) if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  amax *= 0.75f;  // below the true amax: the largest elements saturate
  for (int64_t rank = 0; rank < s.G; ++rank) {
    const int64_t valid = g.geometry.valid_rows(rank);
    AlignedBytes shard =
        shard_bytes(w, s.cols, rank * g.geometry.shard_rows, valid, SourceDtype::kFP32);
    AlignedBytes chunk(layout.chunk_bytes);
    PackArgs a;
    a.src_dtype = SourceDtype::kFP32;
    a.shard_rows = g.geometry.shard_rows;
    a.valid_rows = valid;
    a.cols = s.cols;
    a.shard = shard.data();
    a.chunk = chunk.data();
    a.chunk_capacity = layout.chunk_bytes;
    a.amax = shared_amax ? &amax : nullptr;
    pack_reference(spec, a);
    std::memcpy(g.chunks.data() + rank * layout.chunk_bytes, chunk.data(), layout.chunk_bytes);
  }
  return g;
}

// `count` weight shapes valid for `format`, all different: first the edge shapes of kShapes but the
// large one (ragged rows, G = 1..8, an odd NVFP4 group count), then random ones (ragged rows, G up to 8).
std::vector<Shape> many_shapes(WireFormat format, int count, std::mt19937_64& rng) {
  std::vector<Shape> out;
  const size_t edge_shapes = sizeof(kShapes) / sizeof(kShapes[0]) - 1;
  for (size_t i = 0; i < edge_shapes && static_cast<int>(out.size()) < count; ++i)
    if (kShapes[i].cols % column_multiple(format) == 0) out.push_back(kShapes[i]);
  const int64_t multiple = column_multiple(format);
  const int64_t groups[] = {1, 2, 3, 4, 8};
  while (static_cast<int>(out.size()) < count) {
    out.push_back(Shape{std::uniform_int_distribution<int64_t>(1, 600)(rng),
                        multiple * std::uniform_int_distribution<int64_t>(1, 512 / multiple)(rng),
                        groups[std::uniform_int_distribution<int>(0, 4)(rng)]});
  }
  return out;
}

// All jobs' chunks in one device buffer and all outputs in another, each output followed by a gap
// of 256 bytes: the whole output buffer is compared, so a write outside a job's output shows too.
void compare_unpack_many(const WireSpec& spec, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<Shape> shapes = many_shapes(spec.format, count, rng);
  std::vector<GatheredWeight> weights;
  std::vector<int64_t> chunk_offset, out_offset;
  int64_t chunk_bytes = 0, out_bytes = 0;
  for (int i = 0; i < count; ++i) {
    EdgeCases edges;
    edges.non_finite = i % 2 == 1;
    weights.push_back(gathered_reference(spec, shapes[i], edges, i % 3 == 0, rng()));
    chunk_offset.push_back(chunk_bytes);
    chunk_bytes += round_up(static_cast<int64_t>(weights.back().chunks.size()), 256);
    out_offset.push_back(out_bytes);
    out_bytes += round_up(shapes[i].rows * shapes[i].cols * 2, 256) + 256;
  }
  AlignedBytes host_chunks(chunk_bytes);
  for (int i = 0; i < count; ++i)
    std::memcpy(host_chunks.data() + chunk_offset[i], weights[i].chunks.data(), weights[i].chunks.size());
  DeviceBuffer d_chunks(chunk_bytes), d_out(out_bytes);
  d_chunks.upload(host_chunks.data(), chunk_bytes);
  std::vector<UnpackJob> jobs;
  for (int i = 0; i < count; ++i) {
    const int64_t bytes = shapes[i].rows * shapes[i].cols * 2;
    jobs.push_back(UnpackJob{{d_chunks.get() + chunk_offset[i],
                              static_cast<int64_t>(weights[i].chunks.size()), weights[i].geometry},
                             d_out.get() + out_offset[i], bytes});
  }
  std::vector<AlignedBytes> reference;
  for (int i = 0; i < count; ++i) {
    reference.emplace_back(jobs[i].out_capacity);
    unpack_reference(spec, {host_chunks.data() + chunk_offset[i], jobs[i].in.capacity,
                            weights[i].geometry}, reference[i].data(), jobs[i].out_capacity);
  }
  for (uint8_t poison : {0xA5, 0x5A}) {
    std::vector<uint8_t> expected(out_bytes, poison);
    for (int i = 0; i < count; ++i)
      std::memcpy(expected.data() + out_offset[i], reference[i].data(), jobs[i].out_capacity);
    d_out.fill(poison);
    unpack_many_cuda(spec, jobs.data(), count, nullptr);
    const std::vector<uint8_t> got = d_out.download(out_bytes);
    for (int i = 0; i < count; ++i) {
      const int64_t end = i + 1 < count ? out_offset[i + 1] : out_bytes;
      EXPECT_EQ(std::memcmp(got.data() + out_offset[i], expected.data() + out_offset[i],
                            end - out_offset[i]), 0)
          << name(spec) << " unpack_many of " << count << ": job " << i << " rows="
          << shapes[i].rows << " cols=" << shapes[i].cols << " G=" << shapes[i].G
          << " (or the gap after it) differs, poison " << int(poison);
    }
  }
}

TEST_F(CudaKernels, UnpackManyMatchesTheReferenceForEachJobBitForBit) {
  static_assert(70 > kUnpackJobsPerLaunch, "70 jobs must take more than one launch");
  std::mt19937_64 seeds(std::random_device{}());
  for (const WireSpec& spec : kAllSpecs) {
    for (int count : {1, 3, 70}) {
      const uint64_t seed = seeds();
      SCOPED_TRACE(name(spec) + " jobs " + std::to_string(count) + " seed " + std::to_string(seed));
      compare_unpack_many(spec, count, seed);
    }
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

namespace gtp::kernels {
namespace {

// Eight FP8 jobs in host memory, job 5's capacity two bytes short: unpack_many_cuda and
// unpack_many_reference refuse the call naming job 5, and no output is written, not even the
// valid jobs before it (the reference would write them if it checked job by job).
TEST(CudaKernelArguments, UnpackManyRefusesABadJobByIndexBeforeWritingAnything) {
  const WireSpec spec{WireFormat::kFP8};
  const WeightGeometry g = weight_geometry(spec.format, 40, 64, 2);
  const ChunkLayout l = chunk_layout(spec, g.shard_rows, g.cols);
  AlignedBytes chunks(l.chunk_bytes * g.group_size, 0);  // all-zero codes and decode scales
  const int64_t out_bytes = g.rows * g.cols * 2;
  std::vector<AlignedBytes> outs;
  std::vector<UnpackJob> jobs;
  for (int i = 0; i < 8; ++i) outs.emplace_back(out_bytes, 0xA5);
  for (int i = 0; i < 8; ++i)
    jobs.push_back(UnpackJob{{chunks.data(), l.chunk_bytes * g.group_size, g}, outs[i].data(),
                             i == 5 ? out_bytes - 2 : out_bytes});
  const std::vector<uint8_t> poison(out_bytes, 0xA5);
  for (bool cuda : {true, false}) {
    try {
      if (cuda) unpack_many_cuda(spec, jobs.data(), 8, nullptr);
      else unpack_many_reference(spec, jobs.data(), 8);
      ADD_FAILURE() << "a short output capacity in job 5 was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("unpack job 5 of 8"), std::string::npos) << what;
      EXPECT_NE(what.find("out capacity=" + std::to_string(out_bytes - 2)), std::string::npos) << what;
    }
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(std::memcmp(outs[i].data(), poison.data(), out_bytes), 0)
          << "job " << i << " written " << (cuda ? "by unpack_many_cuda" : "by unpack_many_reference");
  }
  // The same jobs, all valid, are unpacked by the reference: the refusal above was job 5's alone.
  jobs[5].out_capacity = out_bytes;
  unpack_many_reference(spec, jobs.data(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_NE(std::memcmp(outs[i].data(), poison.data(), out_bytes), 0);
}

TEST(CudaKernelArguments, UnpackManyRefusesANullJobArrayAndANegativeCount) {
  const WireSpec spec{WireFormat::kMXFP8};
  for (bool cuda : {true, false}) {
    try {
      if (cuda) unpack_many_cuda(spec, nullptr, 3, nullptr);
      else unpack_many_reference(spec, nullptr, 3);
      ADD_FAILURE() << "a null job array was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("jobs is null with n=3"), std::string::npos) << e.what();
    }
    UnpackJob job;  // empty: no geometry, null pointers
    try {
      if (cuda) unpack_many_cuda(spec, &job, -1, nullptr);
      else unpack_many_reference(spec, &job, -1);
      ADD_FAILURE() << "a negative job count was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("n=-1"), std::string::npos) << e.what();
    }
    try {
      if (cuda) unpack_many_cuda(spec, &job, 1, nullptr);
      else unpack_many_reference(spec, &job, 1);
      ADD_FAILURE() << "an empty job was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("unpack job 0 of 1: "), std::string::npos) << e.what();
    }
    // Nothing to do is not an error, and touches no CUDA.
    if (cuda) unpack_many_cuda(spec, nullptr, 0, nullptr);
    else unpack_many_reference(spec, nullptr, 0);
  }
}

}  // namespace
}  // namespace gtp::kernels

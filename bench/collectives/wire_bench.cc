#include "bench/collectives/wire_bench.h"

#include <chrono>
#include <cstring>
#include <functional>

#include "kernels/reference.h"

namespace gtp::bench {
namespace {

int64_t shard_rows(const SweepPoint& point) { return static_cast<int64_t>(point.per_rank_count / kWireCols); }

double mean_us(int iters, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) body();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters;
}

kernels::PackArgs pack_args(const std::vector<unsigned char>& shard, const SweepPoint& point, void* chunk,
                            int64_t chunk_bytes) {
  kernels::PackArgs args;
  args.shard = shard.data();
  args.src_dtype = kernels::SourceDtype::kBF16;
  args.shard_rows = args.valid_rows = shard_rows(point);
  args.cols = kWireCols;
  args.chunk = chunk;
  args.chunk_capacity = chunk_bytes;
  return args;
}

}  // namespace

kernels::WireSpec wire_spec(const BenchOptions& options) {
  kernels::WireSpec spec;
  spec.format = *options.format;
  return spec;
}

kernels::WeightGeometry wire_geometry(const BenchOptions& options, const SweepPoint& point, int group_size) {
  return kernels::weight_geometry(*options.format, shard_rows(point) * group_size, kWireCols, group_size);
}

kernels::ChunkLayout wire_layout(const BenchOptions& options, const SweepPoint& point) {
  return kernels::chunk_layout(wire_spec(options), shard_rows(point), kWireCols);
}

std::vector<std::uint16_t> reference_weight(const BenchOptions& options, const SweepPoint& point, int group_size) {
  const kernels::ChunkLayout layout = wire_layout(options, point);
  std::vector<unsigned char> chunks(layout.chunk_bytes * group_size);
  for (int rank = 0; rank < group_size; ++rank) {
    const std::vector<unsigned char> shard = make_input(options, point, rank);
    kernels::pack_reference(wire_spec(options),
                            pack_args(shard, point, chunks.data() + rank * layout.chunk_bytes, layout.chunk_bytes));
  }
  std::vector<std::uint16_t> weight(point.count);
  const kernels::GatheredChunks in{chunks.data(), static_cast<int64_t>(chunks.size()),
                                   wire_geometry(options, point, group_size)};
  kernels::unpack_reference(wire_spec(options), in, weight.data(), static_cast<int64_t>(weight.size() * 2));
  return weight;
}

long long count_mismatches(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& expected) {
  long long wrong = got.size() == expected.size() ? 0 : static_cast<long long>(expected.size());
  for (std::size_t i = 0; i < got.size() && i < expected.size(); ++i) wrong += got[i] != expected[i];
  return wrong;
}

BenchRow summarize_wire(comm::Bootstrap& bootstrap, const BenchOptions& options, const SweepPoint& point,
                        const WireTimes& times, long long wrong, const std::string& path, int group_size,
                        double bf16_gather_us) {
  BenchRow row = summarize(bootstrap, options, point, times.e2e_us, wrong, path, group_size);
  const std::vector<double> mean =
      average_over_ranks(bootstrap, {times.pack_us, times.gather_us, times.unpack_us, times.e2e_us});
  row.type = kernels::to_string(*options.format);
  row.wire = BenchRow::Wire{static_cast<std::size_t>(wire_layout(options, point).chunk_bytes) * group_size,
                            mean[0], mean[1], mean[2], mean[3], bf16_gather_us / mean[3]};
  return row;
}

BenchRow run_host_wire(comm::HostComm& comm, comm::Bootstrap& bootstrap, const BenchOptions& options,
                       const SweepPoint& point, double bf16_gather_us) {
  const kernels::WireSpec spec = wire_spec(options);
  const kernels::ChunkLayout layout = wire_layout(options, point);
  const int n = comm.size();
  const std::vector<unsigned char> shard = make_input(options, point, comm.rank());
  std::vector<unsigned char> chunk(layout.chunk_bytes), gathered(layout.chunk_bytes * n);
  std::vector<std::uint16_t> weight(point.count);
  const kernels::PackArgs args = pack_args(shard, point, chunk.data(), layout.chunk_bytes);
  const kernels::GatheredChunks in{gathered.data(), static_cast<int64_t>(gathered.size()),
                                   wire_geometry(options, point, n)};
  const std::function<void()> pack = [&] { kernels::pack_reference(spec, args); };
  const std::function<void()> gather = [&] { comm.all_gather(chunk.data(), gathered.data(), chunk.size()); };
  const std::function<void()> unpack = [&] {
    kernels::unpack_reference(spec, in, weight.data(), static_cast<int64_t>(weight.size() * 2));
  };
  const std::function<void()> e2e = [&] {
    pack();
    gather();
    unpack();
  };
  for (int i = 0; i < options.warmup; ++i) e2e();
  WireTimes times;
  for (auto [part, time] : {std::pair{&pack, &times.pack_us}, std::pair{&gather, &times.gather_us},
                            std::pair{&unpack, &times.unpack_us}, std::pair{&e2e, &times.e2e_us}}) {
    comm.barrier();
    *time = mean_us(options.iters, *part);
  }
  long long wrong = -1;
  if (options.check) {  // a fresh iteration with every buffer cleared: stale results cannot pass
    std::memset(chunk.data(), 0, chunk.size());
    std::memset(gathered.data(), 0, gathered.size());
    std::memset(weight.data(), 0, weight.size() * 2);
    e2e();
    wrong = count_mismatches(weight, reference_weight(options, point, n));
  }
  return summarize_wire(bootstrap, options, point, times, wrong, "host_wire", n, bf16_gather_us);
}

}  // namespace gtp::bench

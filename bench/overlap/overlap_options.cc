#include "bench/overlap/overlap_options.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace gtp::bench::overlap {
namespace {

constexpr std::int64_t kMaxDim = 65536;
// N and K: a multiple of every wire format's column multiple and row alignment (32, MXFP8's).
constexpr std::int64_t kDimMultiple = 32;
constexpr std::int64_t kMMultiple = 64;  // auto-sized M: a GEMM tile multiple

std::int64_t parse_int(const std::string& flag, const std::string& value, std::int64_t lo, std::int64_t hi) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw std::invalid_argument(flag + " '" + value + "' is not an integer; give e.g. " + flag + " " +
                                std::to_string(lo));
  }
  if (v < lo || v > hi) {
    throw std::invalid_argument(flag + " " + value + " is out of range; give a value in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  }
  return v;
}

std::vector<std::string> split(const std::string& flag, const std::string& list) {
  std::vector<std::string> items;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty())
      throw std::invalid_argument(flag + " '" + list + "' has an empty item; give a comma-separated list");
    items.push_back(item);
  }
  if (items.empty()) throw std::invalid_argument(flag + " is empty; give a comma-separated list");
  std::set<std::string> seen;
  for (const std::string& i : items) {
    if (!seen.insert(i).second) throw std::invalid_argument(flag + " lists '" + i + "' twice; list each once");
  }
  return items;
}

void check_dim(const char* flag, std::int64_t v) {
  if (v % kDimMultiple != 0) {
    throw std::invalid_argument(std::string(flag) + " " + std::to_string(v) + " is not a multiple of " +
                                std::to_string(kDimMultiple) + " (every wire format's row and column multiple); use " +
                                std::to_string((v / kDimMultiple + 1) * kDimMultiple));
  }
}

}  // namespace

std::string usage() {
  return "usage: gtp-overlap-bench [--m auto|M] [--n N] [--k K] [--layers L] [--microbatches B] [--iters N] [--warmup "
         "N]\n"
         "                         [--wires bf16,fp8,mxfp8,nvfp4] [--depths 1,2] [--priorities high,normal]\n"
         "                         [--keep-gathered off|on] [--grads-into-main-grad on|off] [--repack off|on]\n"
         "                         [--bootstrap callbacks|ucx]\n"
         "                         [--gather-gbps B]\n"
         "                         [--timeout-ms T] [--json PATH]\n"
         "A chain of L linear layers (weights [N,K] and [K,N] alternating, activations [M,K]), forward and\n"
         "backward with cuBLAS BF16 GEMMs, with weights materialized by libgtp (C ABI, CUDA backend) against\n"
         "the same chain with resident weights. --m auto (default) picks M so one gather lasts about one GEMM.\n"
         "--microbatches B runs B forward/backward passes per step with wgrads accumulated (one reduce-scatter\n"
         "per weight per step).\n"
         "--keep-gathered on sets the profile's keep_gathered: each weight is gathered once per step and the\n"
         "backward (and later microbatches) read it from its kept slot.\n"
         "--grads-into-main-grad (profile grads_into_main_grad, default on) matters at G = 1 only: on, each wgrad\n"
         "GEMM adds into its FP32 main grad (the reduce-scatter is the identity); off, it writes a grad buffer that\n"
         "is reduce-scattered over the size-1 communicator and added into the main grad, as on G > 1.\n"
         "--repack on re-packs every weight between steps (gtp_weights_shard_updated, outside the step's\n"
         "timing), as after an optimizer step: each step gathers new weights, kept or not.\n"
         "--bootstrap callbacks runs one rank in this process; ucx reads GTP_RANK/GTP_WORLD_SIZE/GTP_ROOT_ADDR\n"
         "(gtp-launch sets them). Exit codes: 0 done, 1 bad flags, 2 no CUDA device, 3 libgtp/CUDA failure.\n";
}

Options parse_options(int argc, const char* const* argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (flag.rfind("--", 0) != 0)
      throw std::invalid_argument("unexpected argument '" + flag + "'; flags start with --");
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--m") {
      o.m = value == "auto" ? 0 : parse_int(flag, value, 1, kMaxDim);
    } else if (flag == "--n") {
      o.n = parse_int(flag, value, kDimMultiple, kMaxDim);
    } else if (flag == "--k") {
      o.k = parse_int(flag, value, kDimMultiple, kMaxDim);
    } else if (flag == "--layers") {
      o.layers = static_cast<int>(parse_int(flag, value, 1, 1024));
    } else if (flag == "--microbatches") {
      o.microbatches = static_cast<int>(parse_int(flag, value, 1, 64));
    } else if (flag == "--iters") {
      o.iters = static_cast<int>(parse_int(flag, value, 1, 100000));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value, 0, 100000));
    } else if (flag == "--wires") {
      o.wires.clear();
      for (const std::string& w : split(flag, value)) {
        try {
          o.wires.push_back(kernels::parse_wire_format(w));
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument("--wires: " + std::string(e.what()));
        }
      }
    } else if (flag == "--depths") {
      o.depths.clear();
      for (const std::string& d : split(flag, value))
        o.depths.push_back(static_cast<int>(parse_int("--depths", d, 0, 64)));
    } else if (flag == "--priorities") {
      o.priorities = split(flag, value);
      for (const std::string& p : o.priorities) {
        if (p != "high" && p != "normal" && p != "low") {
          throw std::invalid_argument("--priorities: '" + p + "' is not a stream priority; use high, normal or low");
        }
      }
    } else if (flag == "--keep-gathered") {
      if (value != "on" && value != "off") {
        throw std::invalid_argument("--keep-gathered '" + value + "' is not on or off");
      }
      o.switches.keep_gathered = value == "on";
    } else if (flag == "--grads-into-main-grad") {
      if (value != "on" && value != "off") {
        throw std::invalid_argument("--grads-into-main-grad '" + value + "' is not on or off");
      }
      o.switches.grads_into_main_grad = value == "on";
    } else if (flag == "--repack") {
      if (value != "on" && value != "off") throw std::invalid_argument("--repack '" + value + "' is not on or off");
      o.repack = value == "on";
    } else if (flag == "--bootstrap") {
      if (value == "callbacks") {
        o.bootstrap = Bootstrap::kCallbacks;
      } else if (value == "ucx") {
        o.bootstrap = Bootstrap::kUcxFromEnv;
      } else {
        throw std::invalid_argument("--bootstrap '" + value +
                                    "' is unknown; use callbacks (one rank) or ucx (GTP_RANK etc.)");
      }
    } else if (flag == "--gather-gbps") {
      std::size_t used = 0;
      double v = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(v > 0) || !std::isfinite(v)) {
        throw std::invalid_argument("--gather-gbps '" + value + "' is not a positive number of GB/s; give e.g. 360");
      }
      o.gather_gbps = v;
    } else if (flag == "--timeout-ms") {
      o.timeout_ms = parse_int(flag, value, 1, 3600000);
    } else if (flag == "--json") {
      if (value.empty()) throw std::invalid_argument("--json needs a file path");
      o.json_path = value;
    } else {
      throw std::invalid_argument("unknown flag '" + flag + "'; see --help");
    }
  }
  check_dim("--n", o.n);
  check_dim("--k", o.k);
  return o;
}

LayerShape layer_shape(const Options& options, int layer) {
  return layer % 2 == 0 ? LayerShape{options.n, options.k} : LayerShape{options.k, options.n};
}

double gather_seconds(std::int64_t elements, int group_size, double copy_bytes_per_s, double busbw_bytes_per_s) {
  if (elements <= 0 || group_size < 1 || !(copy_bytes_per_s > 0) || (group_size > 1 && !(busbw_bytes_per_s > 0))) {
    throw std::invalid_argument("gather_seconds: elements " + std::to_string(elements) + ", G " +
                                std::to_string(group_size) + " and the rates must be positive");
  }
  const double bytes = 2.0 * static_cast<double>(elements);  // the BF16 weight
  const double unpack = bytes / copy_bytes_per_s;
  if (group_size == 1) return bytes / copy_bytes_per_s + unpack;
  // nccl-tests: busbw = algbw * (G-1)/G with algbw = gathered bytes / time.
  return bytes * (group_size - 1) / group_size / busbw_bytes_per_s + unpack;
}

Sizing choose_m(std::int64_t n, std::int64_t k, double gather_s, std::int64_t m_max,
                const std::function<double(std::int64_t)>& rate) {
  if (n <= 0 || k <= 0 || !(gather_s > 0) || m_max < kMMultiple) {
    throw std::invalid_argument("choose_m: N " + std::to_string(n) + ", K " + std::to_string(k) + ", m_max " +
                                std::to_string(m_max) + " and the gather time must be positive (m_max >= 64)");
  }
  const double flops_per_row = 2.0 * static_cast<double>(n) * static_cast<double>(k);
  const std::int64_t top = m_max / kMMultiple * kMMultiple;
  auto clamp_up = [&](double m) {
    const auto rounded = static_cast<std::int64_t>(std::ceil(m / kMMultiple)) * kMMultiple;
    return std::min(top, std::max<std::int64_t>(kMMultiple, rounded));
  };
  Sizing s;
  s.gather_seconds = gather_s;
  std::set<std::int64_t> tried;
  std::int64_t m = clamp_up(1024);
  for (int step = 0; step < 8 && tried.insert(m).second; ++step) {
    const double r = rate(m);
    if (!(r > 0)) throw std::invalid_argument("choose_m: the GEMM rate at M " + std::to_string(m) + " is not positive");
    s.steps.push_back({m, r, flops_per_row * m / r});
    m = clamp_up(gather_s * r / flops_per_row);
  }
  // The smallest M tried whose GEMM is at least as long as the gather (the targets' condition),
  // else the largest M tried.
  const SizingStep* pick = nullptr;
  for (const SizingStep& st : s.steps) {
    if (st.gemm_seconds >= gather_s && (pick == nullptr || st.m < pick->m)) pick = &st;
  }
  if (pick == nullptr) {
    pick = &*std::max_element(s.steps.begin(), s.steps.end(),
                              [](const SizingStep& a, const SizingStep& b) { return a.m < b.m; });
  }
  s.m = pick->m;
  std::ostringstream why;
  why.precision(3);
  why << "one gather of a " << n << "x" << k << " BF16 weight takes " << gather_s * 1e6
      << " us (model from the measured "
      << "copy rate); a GEMM of M " << pick->m << " runs at " << pick->flops_per_s / 1e12 << " TFLOP/s for "
      << pick->gemm_seconds * 1e6 << " us"
      << (pick->gemm_seconds >= gather_s ? ", the smallest M tried with GEMM >= gather"
                                         : ", the largest M tried (M is capped)");
  s.why = why.str();
  return s;
}

std::string profile_json(int world_size, const std::string& stream_priority, int prefetch_depth,
                         kernels::WireFormat wire, GroupSwitches switches) {
  if (world_size < 1) throw std::invalid_argument("profile_json: world_size " + std::to_string(world_size) + " < 1");
  if (stream_priority != "high" && stream_priority != "normal" && stream_priority != "low") {
    throw std::invalid_argument("profile_json: stream priority '" + stream_priority +
                                "' is unknown; use high, normal or low");
  }
  nlohmann::json gpus = nlohmann::json::array();
  // A domain's GPUs list their link into it (the profile reader checks); an H200's NVLink per direction.
  const nlohmann::json link = {{"peer_kind", "nvswitch"}, {"peer", "nvswitch"}, {"gbytes_per_s", 450}};
  for (int g = 0; g < world_size; ++g) {
    gpus.push_back({{"index", g}, {"nvlink", nlohmann::json::array({link})}, {"nvlink_domain", "nvswitch"}});
  }
  const nlohmann::json profile = {
      {"schema_version", 1},
      {"name", "gtp-overlap-bench"},
      {"description", "one host, TP 1, G = world size; the side streams' priority is what the benchmark varies"},
      {"cluster", {{"template", {{"host_count", 1}, {"host", {{"hostname", "bench"}, {"gpus", gpus}}}}}}},
      {"parallel",
       {{"world_size", world_size},
        {"tensor_model_parallel_size", 1},
        {"tensor_parallel_num_weight_shards", world_size}}},
      {"placement", {{"on_violation", "warn"}}},
      {"groups",
       {{"gtp_remat",
         {{"stream_priority", stream_priority},
          {"prefetch_depth", prefetch_depth},
          {"keep_gathered", switches.keep_gathered},
          {"grads_into_main_grad", switches.grads_into_main_grad},
          {"wire_format", kernels::to_string(wire)}}}}}};
  return profile.dump();
}

}  // namespace gtp::bench::overlap

"""Inputs of the GTP cost model (bench/model/gtp_cost_model.py): hardware, network, NCCL latency, kernel
costs measured in this repository, and the layer shapes of two real models. Every number is an `Input`
that names where it comes from and of which kind it is:

  measured   read here from a committed file in bench/results/ (file and field named)
  published  a public figure (document named)
  derived    arithmetic on the above (the arithmetic named)
  guess      no source: a choice this model makes, to be replaced by a measurement

Standard library only (no torch): the model runs anywhere, CI included."""
import json
import os
from dataclasses import dataclass

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")
MIB = 1 << 20


@dataclass(frozen=True)
class Input:
    name: str
    value: float
    unit: str
    kind: str  # measured | published | derived | guess
    source: str


def _load(results_dir, name):
    path = os.path.join(results_dir, name)
    if not os.path.exists(path):
        raise ValueError(f"measured input file {path} is missing: pass results_dir= the repository's "
                         f"bench/results folder (or run from a checkout)")
    with open(path) as f:
        return json.load(f)


def _kernel_row(bench, fmt, op, shard_mib=256):
    for r in bench["results"]:
        if r["format"] == fmt and r["op"] == op and r["shard_mib"] == shard_mib:
            return r
    raise ValueError(f"kernel_bench_v24.json has no row format={fmt} op={op} shard_mib={shard_mib}")


# Kernel rows the model uses: (format, op) -> what it stands for. ns per element of the BF16 weight.
KERNEL_ROWS = {
    ("-", "d2d_copy"): "device copy (2 B read + 2 B written per element)",
    ("fp8", "unpack_gemm"): "libgtp FP8 unpack into the GEMM layout (codes), forward",
    ("fp8", "unpack_gemm_t"): "libgtp FP8 unpack with the transposed copy Hopper FP8 GEMMs need, backward",
    ("fp8", "unpack_bf16"): "libgtp FP8 wire decoded to BF16",
    ("mxfp8", "unpack_bf16"): "libgtp MXFP8 wire decoded to BF16",
    ("mxfp8", "unpack_gemm"): "libgtp MXFP8 unpack into the GEMM layout",
    ("nvfp4_2d", "unpack_bf16"): "libgtp NVFP4 (16x16) wire decoded to BF16",
    ("nvfp4_2d", "unpack_gemm"): "libgtp NVFP4 (16x16) unpack into the GEMM layout",
    ("nvfp4_2d", "unpack_gemm_t"): "libgtp NVFP4 (16x16) unpack with its exact transpose",
}


def measured_inputs(results_dir=RESULTS_DIR):
    """Reads the measured inputs from bench/results/. Returns {name: Input}."""
    out = {}
    kb = _load(results_dir, "kernel_bench_v24.json")
    card = kb["machine"]["gpu"]
    for (fmt, op), what in KERNEL_ROWS.items():
        r = _kernel_row(kb, fmt, op)
        elements = r["shard_mib"] * MIB / 2  # the shard is BF16 [rows, 4096]
        out[f"kernel.{fmt}.{op}"] = Input(
            f"kernel.{fmt}.{op}", r["median_us"] * 1e3 / elements, "ns/element", "measured",
            f"bench/results/kernel_bench_v24.json results[format={fmt}, op={op}, shard_mib=256].median_us "
            f"/ 128 Mi elements ({card}): {what}")
    # The per-op floor of one NCCL call: a size-1 communicator's all_gather at 4 MiB (launch + local copy).
    ag = _load(results_dir, "comm_all_gather_bf16.json")
    floor = [r for r in ag["results"] if r["path"] == "nccl" and r["size"] == 4 * MIB][0]
    out["nccl.op_floor_us"] = Input(
        "nccl.op_floor_us", floor["time_us"], "us", "measured",
        "bench/results/comm_all_gather_bf16.json results[path=nccl, size=4 MiB].time_us (H200, one rank: "
        "the launch and a local copy, the floor under any real op)")
    # GEMM efficiency: 8 x te.Linear(8192) fwd + bwd, GTP off, 4 microbatches of 4096 tokens.
    te = _load(results_dir, "te_stack_bench_zeroed.json")
    flops = 3 * 2 * te["tokens_per_microbatch"] * te["hidden"] ** 2 * te["layers"]
    for mode, peak in (("bf16", 989e12), ("fp8", 1979e12)):
        row = [c for c in te["configs"] if c["mode"] == mode and c["microbatches"] == 4
               and not c["declare_zeroed"]][0]
        achieved = flops * 4 / (row["step_ms_off"] * 1e-3)
        out[f"gemm.mfu.{mode}"] = Input(
            f"gemm.mfu.{mode}", achieved / peak, "fraction of dense peak", "measured",
            f"bench/results/te_stack_bench_zeroed.json configs[mode={mode}, microbatches=4, declare_zeroed="
            f"false].step_ms_off: {achieved / 1e12:.0f} TFLOP/s over {peak / 1e12:.0f} (H200; GH100's dense "
            f"peak is the same on H100 SXM, so it is taken for H100)")
    return out


def published_inputs():
    """Hardware, network and NCCL figures from public sources. {name: Input}."""
    rows = [
        Input("gemm.peak.bf16", 989e12, "FLOP/s", "published",
              "H100 SXM dense BF16 peak (NVIDIA H100 datasheet; perf-anchors.md [S38])"),
        Input("gemm.peak.fp8", 1979e12, "FLOP/s", "published",
              "H100 SXM dense FP8 peak (NVIDIA H100 datasheet; perf-anchors.md [S38])"),
        Input("hbm.h100", 3.35e12, "B/s", "published", "H100 SXM HBM3 datasheet (perf-anchors.md [S37])"),
        Input("hbm.h200", 4.8e12, "B/s", "published", "H200 HBM3e datasheet (perf-anchors.md [S12])"),
        Input("net.nvlink_busbw", 361.4e9, "B/s", "published",
              "NCCL ring all-gather busbw, 8x H200, 16 GiB (perf-anchors.md 1.2 [S6]); H100 has the same "
              "NVLink4/NVSwitch fabric (450 GB/s line rate per direction) and ring busbw 365-370 [S7]"),
        Input("net.ib_busbw", 46e9, "B/s", "published",
              "NDR 400 Gb/s per GPU (one CX-7 per GPU): 'for NDR @ 400Gbps you should see 46-48GB/s per "
              "NIC' (NCCL maintainer, NVIDIA/nccl-tests#290, 2025-03-03); low end taken"),
        Input("nccl.base_lat_us", 6.6, "us", "published",
              "NCCL tuning model, Ring LL base latency (NVIDIA/nccl src/graph/tuning.cc; perf-anchors.md 1.4 [S9])"),
        Input("nccl.nvlink_hop_us", 0.6, "us", "published",
              "NCCL tuning model, NVLink Ring LL per-step latency (perf-anchors.md 1.4 [S9])"),
        Input("nccl.net_hop_us", 2.7, "us", "published",
              "NCCL tuning model, NET Ring LL per-step latency (NVIDIA/nccl src/graph/tuning.cc hwLat[NET], "
              "commit 01afd20a; an older NCCL than perf-anchors' [S9])"),
        Input("nccl.intra_hop_multinode_factor", 1.8, "x", "published",
              "NCCL tuning model: intra-node LL step latency x1.8 when the ring spans nodes (same file)"),
        Input("gpus_per_node", 8, "GPUs", "published", "HGX H100: 8 GPUs per NVLink domain"),
    ]
    return {r.name: r for r in rows}


# The defaults of gtp_cost_model.Config that are inputs of the model (listed in guessed_inputs with
# their reasons): one value, read by both.
CONFIG_DEFAULTS = {"seq": 4096, "mbs": 1, "microbatches": 8, "libgtp_depth": 2}


def guessed_inputs():
    """Choices with no source. Each is a knob the first multi-GPU run should replace."""
    rows = [
        Input("grouped_op_latency_fraction", 1.0, "x alpha", "guess",
              "latency of each further op inside one NCCL group launch, as a fraction of a lone op's. 1.0 "
              "(no sharing) is the upper bound; part 3's NCCL log + profiler measure it"),
        Input("attention_mfu_ratio", 1.0, "x GEMM MFU", "guess",
              "flash attention core runs at the GEMMs' measured efficiency"),
        Input("attention_bwd_ratio", 2.5, "x fwd FLOPs", "guess",
              "attention core backward costs 2.5x its forward (FlashAttention-2's usual ratio; not measured here)"),
        Input("dp_sync_exposed_fraction", 0.5, "fraction", "guess",
              "share of the per-step data-parallel grad reduce-scatter + param all-gather left exposed "
              "(Megatron overlaps buckets with the backward and the next forward; same for both systems)"),
        Input("dp_bucket_params", 40e6, "params", "published",
              "Megatron DDP bucket size max(40M, 1M x dp) (perf-anchors.md 4.3 [S87]); 40M taken"),
        Input("seq_len", CONFIG_DEFAULTS["seq"], "tokens", "guess", "sequence length of every configuration"),
        Input("micro_batch", CONFIG_DEFAULTS["mbs"], "sequences", "published",
              "mbs 1, as NVIDIA's GTP weak-scaling run (gtp-anatomy.md 10.2)"),
        Input("microbatches", CONFIG_DEFAULTS["microbatches"], "per step", "guess",
              "gradient-accumulation microbatches per step"),
        Input("libgtp_depth", CONFIG_DEFAULTS["libgtp_depth"], "weights", "guess",
              "libgtp prefetch depth (the depth of the overlap headline, performance.md)"),
        Input("h100_kernel_scale", 4.8 / 3.35, "x", "derived",
              "kernels measured on the H200 are memory-bound: their time scales by HBM 4.8 / 3.35 TB/s on "
              "H100 (perf-anchors [S12][S37]); L2-bound parts would scale less"),
    ]
    return {r.name: r for r in rows}


def all_inputs(results_dir=RESULTS_DIR):
    out = {}
    out.update(published_inputs())
    out.update(guessed_inputs())
    out.update(measured_inputs(results_dir))
    return out


# ---- model shapes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    name: str
    source: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int = 0             # dense MLP intermediate size (0: every layer is MoE)
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    tied_embedding: bool = False


LLAMA3_70B = Model(
    name="dense-70b", hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, vocab=128256, ffn=28672,
    source="Llama-3-70B-like (brief; Meta's published config: hidden 8192, ffn 28672, 80 layers, GQA 64/8, "
           "vocab 128256), SwiGLU, untied embedding")

# NVIDIA's GTP16 x EP8 x EGTP2 convergence run: gtp-anatomy.md 10.2 says its shape "was not found" in
# any public source. Chosen here instead: a Qwen3-235B-A22B-like MoE (its published config), every layer MoE.
MOE_235B = Model(
    name="moe-235b", hidden=4096, layers=94, heads=64, kv_heads=4, head_dim=128, vocab=151936,
    experts=128, top_k=8, expert_ffn=1536,
    source="CHOSEN, not NVIDIA's run (its shape is not public, gtp-anatomy.md 10.2): Qwen3-235B-A22B-like "
           "(hidden 4096, 94 layers, 64 / 4 heads of 128, 128 experts top-8 of ffn 1536, vocab 151936)")

MODELS = {m.name: m for m in (LLAMA3_70B, MOE_235B)}

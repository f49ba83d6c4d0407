#!/usr/bin/env python3
"""A cost model of GTP weight re-materialization at scale: libgtp against Megatron-Core's own GTP, on
H100 nodes (NVLink in a node, InfiniBand NDR across), for real layer shapes. A MODEL, not a measurement:
docs/performance.md ("At scale (model)") lists what it assumes; the first multi-GPU machine checks it,
and `check_counts` compares its NCCL op and byte counts with those measured on real peers (issue 41
part 3).

    python3 bench/model/gtp_cost_model.py [--json out.json] [--inputs]

Per layer and microbatch it prices each weight's gather (bytes on the wire per rank from the format,
(G-1)/G ring, NCCL latency x ops), libgtp's fused unpack (measured GB/s), Megatron's separate steps, the
reduce-scatter and the GEMMs, then plays the step through one compute stream and one network queue:
Megatron prefetches one weight ahead within each chain and gathers every chain head on demand (each
microbatch); libgtp prefetches `depth` ahead along the whole step, across chain and microbatch borders."""
import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import inputs as inp  # noqa: E402
import wire  # noqa: E402

GEMM_FORMATS = ("bf16", "fp8")   # H100 GEMMs; MXFP8 and NVFP4 GEMMs need sm_100


@dataclass(frozen=True)
class Config:
    model: str
    g: int                      # dense gtp_remat group
    wire: str
    gemm: str = "bf16"
    tp: int = 1
    ep: int = 1
    eg: int = 1                 # expert gtp_remat group
    seq: int = inp.CONFIG_DEFAULTS["seq"]
    mbs: int = inp.CONFIG_DEFAULTS["mbs"]
    microbatches: int = inp.CONFIG_DEFAULTS["microbatches"]
    gpus: int = 128
    libgtp_depth: int = inp.CONFIG_DEFAULTS["libgtp_depth"]
    fill_tag: bool = True               # libgtp's 64-byte tag per fill (one more op in the fill's group)
    accumulate_microbatches: bool = False  # libgtp: one reduce-scatter per step instead of per microbatch
    megatron_rs_bytes: int = 4          # main_grad dtype of Megatron's reduce-scatter (4 FP32, 2 BF16)
    megatron_both_usages: bool = False  # rowwise + columnwise in one gather: 4 ops per quantized weight


@dataclass
class Entry:
    """One consume on the compute stream: a weight role's GEMMs (and the work that follows them)."""
    name: str
    chain: str
    compute: float
    gather: float = 0.0       # seconds on the network queue (0: nothing to gather)
    rs: float = 0.0
    rs_sync: bool = False
    ops: int = 0
    bytes: int = 0


class Costs:
    """Prices from the input table (inputs.py)."""

    def __init__(self, values=None):
        self.v = {k: i.value for k, i in (values or inp.all_inputs()).items()}

    def __getitem__(self, k):
        return self.v[k]

    def ring(self, g, stride):
        """(nodes spanned, busbw) of a group of g ranks `stride` ranks apart."""
        gpn = int(self["gpus_per_node"])
        nodes = min(g, max(1, math.ceil(stride * g / gpn)))
        bw = self["net.ib_busbw"] if nodes > 1 else self["net.nvlink_busbw"]
        if bw <= 0:
            raise ValueError(f"bandwidth {bw} B/s must be positive: set net.ib_busbw / net.nvlink_busbw")
        return nodes, bw

    def alpha(self, g, nodes):
        """NCCL's Ring LL latency model for an all-gather / reduce-scatter of g ranks over `nodes` nodes,
        never below the measured floor of one NCCL call."""
        intra = (g - nodes) * self["nccl.nvlink_hop_us"] * (self["nccl.intra_hop_multinode_factor"]
                                                            if nodes > 1 else 1.0)
        model = self["nccl.base_lat_us"] + intra + (nodes - 1) * self["nccl.net_hop_us"]
        return max(model, self["nccl.op_floor_us"]) * 1e-6

    def collective(self, g, stride, ops, bytes_per_rank):
        if g == 1 or ops == 0:
            return 0.0
        nodes, bw = self.ring(g, stride)
        latency = self.alpha(g, nodes) * (1 + (ops - 1) * self["grouped_op_latency_fraction"])
        return latency + (g - 1) * bytes_per_rank / bw

    def gemm(self, flops, fmt):
        return flops / (self[f"gemm.peak.{fmt}"] * self[f"gemm.mfu.{fmt}"])

    def kernel(self, fmt, op, elements):
        """A kernel measured on the H200, scaled to H100 HBM."""
        return elements * self[f"kernel.{fmt}.{op}"] * 1e-9 * self["h100_kernel_scale"]


def validate(cfg):
    m = inp.MODELS.get(cfg.model)
    if m is None:
        raise ValueError(f"model = {cfg.model!r}: use one of {', '.join(inp.MODELS)}")
    wire.check_format(cfg.wire)
    for what in ("g", "tp", "ep", "eg", "microbatches", "mbs", "seq", "gpus"):
        wire.check_group(getattr(cfg, what), what)
    if cfg.gemm not in GEMM_FORMATS:
        raise ValueError(f"gemm = {cfg.gemm!r}: H100 GEMMs run {' or '.join(GEMM_FORMATS)}")
    if cfg.gemm == "fp8" and cfg.wire != "fp8":
        raise ValueError(f"gemm fp8 with wire {cfg.wire!r}: this model prices FP8 GEMMs with the FP8 wire only")
    if cfg.gpus % (cfg.tp * cfg.g):
        raise ValueError(f"gpus = {cfg.gpus} is not divisible by tp x g = {cfg.tp * cfg.g}: choose gpus as a "
                         f"multiple of {cfg.tp * cfg.g}")
    if m.experts:
        if m.experts % cfg.ep:
            raise ValueError(f"ep = {cfg.ep} does not divide the {m.experts} experts: use a divisor")
        if cfg.gpus % (cfg.ep * cfg.eg):
            raise ValueError(f"gpus = {cfg.gpus} is not divisible by ep x eg = {cfg.ep * cfg.eg}")
    elif cfg.eg != 1 or cfg.ep != 1:
        raise ValueError(f"{cfg.model} has no experts: leave ep and eg at 1")
    return m


def weights(m, cfg):
    """The layer's weight roles in forward order: (name, chain, rows, cols, count, group, stride, token
    multiplier). rows x cols is the TP-local weight before GTP; count same-shape weights (experts)."""
    h, tp = m.hidden, cfg.tp
    attn = [("qkv", "dense", (m.heads + 2 * m.kv_heads) * m.head_dim // tp, h, 1, cfg.g, tp, 1),
            ("proj", "dense", h, m.heads * m.head_dim // tp, 1, cfg.g, tp, 1)]
    if m.experts:
        e = m.experts // cfg.ep
        mlp = [("experts_fc1", "experts_fc1", 2 * m.expert_ffn, h, e, cfg.eg, cfg.ep, m.top_k / e),
               ("experts_fc2", "experts_fc2", h, m.expert_ffn, e, cfg.eg, cfg.ep, m.top_k / e)]
    else:
        mlp = [("fc1", "dense", 2 * m.ffn // tp, h, 1, cfg.g, tp, 1),
               ("fc2", "dense", h, m.ffn // tp, 1, cfg.g, tp, 1)]
    return attn + mlp


def _entry(c, cfg, system, name, chain, rows, cols, count, group, stride, flops, direction, rs):
    ops, nbytes = wire.gather_counts(system, rows, cols, group, cfg.wire, direction, count, cfg.fill_tag,
                                     cfg.megatron_both_usages)
    gather = c.collective(group, stride, ops, nbytes / max(ops, 1) * ops) if group > 1 else 0.0
    elements = wire.shard_rows(rows, cols, group, cfg.wire) * group * cols * count
    compute = c.gemm(flops, cfg.gemm)
    if system == "libgtp" and cfg.wire != "bf16" and group > 1:
        kern = ("unpack_gemm" if direction == "fwd" else "unpack_gemm_t") if cfg.gemm == "fp8" else "unpack_bf16"
        gather += c.kernel("nvfp4_2d" if cfg.wire == "nvfp4" else cfg.wire, kern, elements)
    if system == "megatron" and cfg.wire == "fp8" and direction == "bwd" and group > 1:
        # Hopper has no non-TN FP8 GEMM: TE builds the transpose of the gathered codes (1 B read + 1 B
        # written per element: half a BF16 copy) on the compute stream (gtp-anatomy.md 5.1).
        compute += c.kernel("-", "d2d_copy", elements) / 2
    rs_time = 0.0
    if rs and group > 1:
        nbytes_rs = 4 if system == "libgtp" else cfg.megatron_rs_bytes
        rows_rs = wire.shard_rows(rows, cols, group, "bf16")
        rs_time = c.collective(group, stride, count, count * rows_rs * cols * nbytes_rs)
    return Entry(f"{name}.{direction}", chain, compute, gather, rs_time, ops=ops, bytes=nbytes)


def microbatch(c, cfg, system, last):
    """The entries of one microbatch, forward then backward."""
    m = validate(cfg)
    t = cfg.seq * cfg.mbs
    rs = system == "megatron" or not cfg.accumulate_microbatches or last
    attn_fwd = 2 * t * cfg.seq * m.heads * m.head_dim / cfg.tp   # causal: half of 4 T s d
    attn_time = c.gemm(attn_fwd, "bf16") / c["attention_mfu_ratio"]
    emb = (m.vocab // cfg.tp, m.hidden, 1, cfg.g, cfg.tp)
    fwd = [_entry(c, cfg, system, "embedding", "head", *emb, 0, "fwd", False)]
    bwd = []
    for layer in range(m.layers):
        for (name, chain, rows, cols, count, group, stride, mult) in weights(m, cfg):
            flops = 2 * t * mult * rows * cols * count
            e_f = _entry(c, cfg, system, f"l{layer}.{name}", chain, rows, cols, count, group, stride, flops,
                         "fwd", False)
            e_b = _entry(c, cfg, system, f"l{layer}.{name}", chain, rows, cols, count, group, stride, 2 * flops,
                         "bwd", rs)
            if name == "qkv":   # the attention core follows the QKV GEMM, its backward precedes QKV's
                e_f.compute += attn_time
                e_b.compute += attn_time * c["attention_bwd_ratio"]
            fwd.append(e_f)
            bwd.append(e_b)
    out_flops = 2 * t * m.vocab / cfg.tp * m.hidden
    fwd.append(_entry(c, cfg, system, "output", "dense", *emb, out_flops, "fwd", False))
    bwd.append(_entry(c, cfg, system, "output", "out_bwd", *emb, 2 * out_flops, "bwd", rs))
    bwd.reverse()
    # The embedding's backward is a scatter-add: no gather, only its reduce-scatter, synchronous in
    # Megatron (the chain head's finalize; gtp-anatomy.md 4, step 5).
    emb_rs = _entry(c, cfg, system, "embedding", "head", *emb, 0, "bwd", rs)
    emb_rs.gather, emb_rs.ops, emb_rs.bytes, emb_rs.rs_sync = 0.0, 0, 0, system == "megatron"
    return fwd, bwd + [emb_rs]


def simulate(phases, depth):
    """Plays a step. `phases` is a list of entry lists. depth None: Megatron (one ahead within each chain
    of a phase; each chain's first entry gathered on demand); depth d: libgtp (d ahead along the whole
    step; the step's first d gathers issued at its start, after the re-pack). Returns (step seconds,
    compute seconds)."""
    seq = [(p, e) for p, phase in enumerate(phases) for e in phase]
    gathers = [i for i, (_, e) in enumerate(seq) if e.gather > 0]
    done = {}
    net_free = 0.0

    def issue(i, at):
        nonlocal net_free
        if i in done:
            return
        start = max(at, net_free)
        net_free = start + seq[i][1].gather
        done[i] = net_free

    following = {}
    if depth is None:
        last = {}
        for i in gathers:
            key = (seq[i][0], seq[i][1].chain)
            if key in last:
                following[last[key]] = i
            last[key] = i
    else:
        for k, i in enumerate(gathers[:depth]):
            issue(i, 0.0)
        rank = {i: k for k, i in enumerate(gathers)}
    now = 0.0
    compute = 0.0
    for i, (_, e) in enumerate(seq):
        if e.gather > 0:
            issue(i, now)             # on demand, unless prefetched
            now = max(now, done[i])
            if depth is None:
                if i in following:
                    issue(following[i], now)
            else:
                k = rank[i] + depth
                if k < len(gathers):
                    issue(gathers[k], now)
        now += e.compute
        compute += e.compute
        if e.rs > 0:
            start = max(now, net_free)
            net_free = start + e.rs
            if e.rs_sync:
                now = net_free
    return max(now, net_free), compute


def dp_sync(c, cfg):
    """Exposed seconds per step of the data-parallel grad reduce-scatter (FP32) and param all-gather (BF16)
    over the replicate groups, bucketed as Megatron's DDP. The same for both systems."""
    m = validate(cfg)
    attn = (m.heads + 2 * m.kv_heads) * m.head_dim * m.hidden + m.heads * m.head_dim * m.hidden
    dense = m.layers * attn + (1 if m.tied_embedding else 2) * m.vocab * m.hidden
    groups = [(dense / (cfg.tp * cfg.g), cfg.gpus // (cfg.tp * cfg.g))]
    if m.experts:
        groups.append((m.layers * m.experts * 3 * m.hidden * m.expert_ffn / (cfg.ep * cfg.eg),
                       cfg.gpus // (cfg.ep * cfg.eg)))
    else:
        groups[0] = ((dense + m.layers * 3 * m.hidden * m.ffn) / (cfg.tp * cfg.g), groups[0][1])
    total = 0.0
    for params, dp in groups:
        if dp == 1:
            continue
        buckets = math.ceil(params / max(c["dp_bucket_params"], 1e6 * dp))
        total += 2 * buckets * c.alpha(dp, dp) + (dp - 1) / dp * params * 6 / c["net.ib_busbw"]
    return total * c["dp_sync_exposed_fraction"]


def predict(cfg, c=None):
    """Both systems on one configuration: step seconds, exposed communication, counts per microbatch."""
    c = c or Costs()
    validate(cfg)
    out = {"config": cfg.__dict__.copy()}
    for system in ("libgtp", "megatron"):
        if system == "megatron" and cfg.wire in ("mxfp8", "nvfp4"):
            out[system] = {"available": False, "why": "Megatron's MXFP8 / NVFP4 GTP gathers feed MXFP8 / NVFP4 "
                                                      "GEMMs, which need sm_100; H100 has none"}
            continue
        phases = []
        for mb in range(cfg.microbatches):
            phases.extend(microbatch(c, cfg, system, mb == cfg.microbatches - 1))
        step, compute = simulate(phases, cfg.libgtp_depth if system == "libgtp" else None)
        sync = dp_sync(c, cfg)
        entries = phases[0] + phases[1]
        out[system] = {
            "available": True, "step_s": step + sync, "compute_s": compute,
            "exposed_comm_s": step - compute, "exposed_pct": 100 * (step - compute) / (step + sync),
            "dp_sync_exposed_s": sync,
            "gather_ops_per_microbatch": sum(e.ops for e in entries),
            "gather_bytes_per_microbatch": sum(e.bytes for e in entries),
            "network_s_per_microbatch": sum(e.gather + e.rs for e in entries),
        }
    if out["megatron"]["available"]:
        out["libgtp_speedup"] = out["megatron"]["step_s"] / out["libgtp"]["step_s"]
    return out


def weak_scaling(cfg, gpus=(128, 256, 512, 1024, 2048, 3072), c=None):
    """Step time at each GPU count with the per-GPU work fixed (DP grows), and the efficiency against the
    first count, per system."""
    c = c or Costs()
    rows = []
    for n in gpus:
        p = predict(replace(cfg, gpus=n), c)
        rows.append({"gpus": n, **{s: p[s]["step_s"] for s in ("libgtp", "megatron") if p[s]["available"]}})
    for s in ("libgtp", "megatron"):
        if s in rows[0]:
            for r in rows:
                r[f"{s}_efficiency"] = rows[0][s] / r[s]
    return rows


def check_counts(measured, c=None):
    """Compares the model's NCCL counts with a JSON measured on real peers (issue 41 part 3):
    {"g": 4, "wire": "bf16", "weights": [{"name", "rows", "cols", "count": 1, "direction": "fwd",
    "libgtp": {"ops", "bytes"}, "megatron": {"ops", "bytes"}}]}, bytes = what each rank sends in that
    weight's gathers (NCCL's INFO log: count x type size per AllGather). Returns one row per weight and
    system with the model's and the measured figures and `ok`."""
    for key in ("g", "wire", "weights"):
        if key not in measured:
            raise ValueError(f"measured counts lack {key!r}: expected keys g, wire, weights (see check_counts)")
    rows = []
    for w in measured["weights"]:
        for system in ("libgtp", "megatron"):
            if system not in w:
                continue
            ops, nbytes = wire.gather_counts(system, w["rows"], w["cols"], measured["g"], measured["wire"],
                                             w.get("direction", "fwd"), w.get("count", 1),
                                             measured.get("fill_tag", True), measured.get("both_usages", False))
            got = w[system]
            rows.append({"weight": w["name"], "system": system, "ops_model": ops, "ops_measured": got["ops"],
                         "bytes_model": nbytes, "bytes_measured": got["bytes"],
                         "ok": ops == got["ops"] and nbytes == got["bytes"]})
    return rows


def default_configs():
    dense = [Config("dense-70b", g, w, gemm) for g in (8, 16, 64)
             for (w, gemm) in (("bf16", "bf16"), ("fp8", "fp8"), ("nvfp4", "bf16"))]
    moe = [Config("moe-235b", g, w, gemm, ep=8, eg=2) for g in (8, 16, 64)
           for (w, gemm) in (("bf16", "bf16"), ("fp8", "fp8"))]
    # Across InfiniBand the gathers outrun the GEMMs at mbs 1: four times the tokens per microbatch.
    bigger = [Config("dense-70b", 16, "bf16", mbs=4), Config("dense-70b", 16, "nvfp4", mbs=4),
              Config("moe-235b", 16, "bf16", ep=8, eg=2, mbs=4)]
    return dense + moe + bigger


def report(c=None):
    c = c or Costs()
    preds = [predict(cfg, c) for cfg in default_configs()]
    scaling = {"dense-70b G16 bf16 mbs4": weak_scaling(Config("dense-70b", 16, "bf16", mbs=4), c=c),
               "moe-235b GTP16xEP8xEGTP2 bf16 mbs4": weak_scaling(Config("moe-235b", 16, "bf16", ep=8, eg=2,
                                                                          mbs=4), c=c)}
    return preds, scaling


def fmt_table(preds, scaling):
    lines = ["| model | G | EG | mbs | wire / GEMM | libgtp step s | exposed % | Megatron step s | exposed % | "
             "libgtp ahead | gather ops / mb (libgtp, Megatron) |", "|" + "---|" * 11]
    for p in preds:
        k, lg, mg = p["config"], p["libgtp"], p["megatron"]
        mcol = (f"{mg['step_s']:.2f} | {mg['exposed_pct']:.1f}" if mg["available"] else "n/a (sm_100) | -")
        ahead = f"{100 * (p['libgtp_speedup'] - 1):+.1f} %" if "libgtp_speedup" in p else "-"
        ops = f"{lg['gather_ops_per_microbatch']}, {mg.get('gather_ops_per_microbatch', '-')}"
        lines.append(f"| {k['model']} | {k['g']} | {k['eg']} | {k['mbs']} | {k['wire']} / {k['gemm']} | {lg['step_s']:.2f} | "
                     f"{lg['exposed_pct']:.1f} | {mcol} | {ahead} | {ops} |")
    lines += ["", "| weak scaling | " + " | ".join(str(r["gpus"]) for r in next(iter(scaling.values()))) + " |",
              "|---|" + "---|" * len(next(iter(scaling.values())))]
    for name, rows in scaling.items():
        for s in ("libgtp", "megatron"):
            lines.append(f"| {name}, {s} | " + " | ".join(f"{100 * r[s + '_efficiency']:.1f} %" for r in rows)
                         + " |")
    return "\n".join(lines)


def fmt_inputs(values):
    lines = ["| input | value | unit | kind | source |", "|---|---|---|---|---|"]
    for k in sorted(values):
        i = values[k]
        lines.append(f"| {k} | {i.value:.4g} | {i.unit} | {i.kind} | {i.source} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the predictions, the weak-scaling curves and every input here")
    ap.add_argument("--inputs", action="store_true", help="print the input table with sources")
    ap.add_argument("--commit", default="not recorded", help="the commit the JSON names")
    args = ap.parse_args(argv)
    values = inp.all_inputs()
    c = Costs(values)
    preds, scaling = report(c)
    print(fmt_table(preds, scaling))
    if args.inputs:
        print()
        print(fmt_inputs(values))
    if args.json:
        doc = {"benchmark": "gtp_cost_model", "card": "none (model)", "commit": args.commit,
               "command": "python3 bench/model/gtp_cost_model.py --json bench/results/gtp_cost_model.json "
                          f"--commit {args.commit}",
               "note": "A model, not a measurement (docs/performance.md, 'At scale (model)').",
               "models": {k: m.source for k, m in inp.MODELS.items()},
               "inputs": {k: i.__dict__ for k, i in values.items()},
               "predictions": preds, "weak_scaling": scaling}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

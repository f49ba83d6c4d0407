#!/usr/bin/env python3
"""Draws the committed benchmark results (bench/results/*.json) as PNG files.

    python3 tools/plot_results.py --results bench/results --out bench/results/plots

Five plots, each titled with the machine and the commit its JSON records:
  kernels.png             every wire-format kernel as % of a same-bytes device copy, per size
                          (the kernel_bench*.json with the highest _vN)
  kernels_vs_peer.png     our time against the torch.compile peer's, per format, op and size
                          (the torch_peer*.json with the highest _vN, and the kernel_bench*.json
                          with the same commit: both come from one device call)
  overlap.png             GTP-on / GTP-off step time and exposed communication per wire, prefetch
                          depth and microbatch count (every overlap_*.json)
  collectives.png         libgtp's all-gather / reduce-scatter against raw NCCL, and the wire
                          formats end to end against the BF16 gather (every comm_*.json)
  te_stack.png            TE layers with libgtp against the same TE stack without it: step-time
                          ratio and libgtp's peak memory per mode, microbatches and keep_gathered
                          (te_stack_bench.json)

A JSON that lacks a field the plots need stops the script with exit 1 and a message naming the file
and the field. Needs matplotlib and numpy (tools/constraints.txt pins them).
"""
import argparse
import glob
import json
import os
import re
import sys
import textwrap

WIDTH_IN, HEIGHT_IN, DPI = 13.0, 7.0, 100  # every PNG is 1300 x 700 pixels
PLOTS = ("kernels.png", "kernels_vs_peer.png", "overlap.png", "collectives.png", "te_stack.png")


class ResultsError(Exception):
    """A results file is missing, unreadable, or lacks a field."""


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ResultsError(f"{os.path.basename(path)}: cannot read it as JSON ({e})")


def need(doc, field, path):
    """doc's value at the dotted field name, or a ResultsError naming the file and the field."""
    value = doc
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ResultsError(f"{os.path.basename(path)}: field '{field}' is missing")
        value = value[part]
    return value


def version(path):
    """The N of a name ending in _vN or _vN_suffix; 0 for a name without one."""
    m = re.search(r"_v(\d+)(?:_[a-z]+)?\.json$", os.path.basename(path))
    return int(m.group(1)) if m else 0


def latest(results, pattern):
    paths = sorted(glob.glob(os.path.join(results, pattern)), key=lambda p: (version(p), p))
    if not paths:
        raise ResultsError(f"no {pattern} in {results}")
    return paths[-1]


def machine_text(doc, path):
    m = doc.get("machine")
    if isinstance(m, str) and m:
        return m
    if isinstance(m, dict) and "gpu" in m:
        sms = m.get("sms", m.get("sm_count"))
        return m["gpu"] + (f" ({sms} SMs)" if sms else "")
    if isinstance(m, dict) and "hostname" in m:
        return f"host '{m['hostname']}', " + need(doc, "transport", path)
    if "gpu" in doc:
        return doc["gpu"]
    raise ResultsError(f"{os.path.basename(path)}: field 'machine' is missing")


def source_line(doc, path):
    return (f"{os.path.basename(path)}: {machine_text(doc, path)}; "
            f"commit {need(doc, 'commit', path)}")


def figure(plt, title, sources):
    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    lines = [title] + [textwrap.shorten(s, 150, placeholder=" ...") for s in sources]
    fig.suptitle("\n".join(lines), fontsize=9, x=0.01, ha="left")
    return fig


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


def rows_by(doc, path, fields):
    rows = need(doc, "results", path)
    if not isinstance(rows, list) or not rows:
        raise ResultsError(f"{os.path.basename(path)}: field 'results' is empty or not a list")
    for i, row in enumerate(rows):
        for field in fields:
            need(row, field, f"{path} results[{i}]")
    return rows


def plot_kernels(plt, np, results, out):
    path = latest(results, "kernel_bench*.json")
    doc = load(path)
    rows = rows_by(doc, path, ("format", "op", "shard_mib", "percent_of_copy"))
    rows = [r for r in rows if r["op"] != "d2d_copy"]
    sizes = sorted({r["shard_mib"] for r in rows})
    paths = list(dict.fromkeys((r["format"], r["op"]) for r in rows))
    pct = {(r["format"], r["op"], r["shard_mib"]): r["percent_of_copy"] for r in rows}
    fig = figure(plt, "Wire-format kernels: % of a device copy of the same bytes (higher is better)",
                 [source_line(doc, path), f"command: {need(doc, 'command', path)}"])
    ax = fig.add_axes([0.06, 0.30, 0.92, 0.55])
    x = np.arange(len(paths))
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        ax.bar(x + (i - (len(sizes) - 1) / 2) * width, [pct.get((f, o, size), 0) for f, o in paths],
               width, label=f"{size} MiB shard")
    ax.axhline(100, color="black", linewidth=0.8)
    ax.axhline(85, color="red", linestyle="--", linewidth=0.8, label="target 85 %")
    ax.set_xticks(x, [f"{f} {o}" for f, o in paths], rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, max(pct.values()) * 1.15)
    ax.set_ylabel("% of same-bytes copy")
    ax.legend(fontsize=8, ncol=len(sizes) + 1, loc="upper right")
    return save(fig, out, "kernels.png")


def plot_peer(plt, np, results, out):
    peer_path = latest(results, "torch_peer*.json")
    peer = load(peer_path)
    commit = need(peer, "commit", peer_path)
    ours_path = next((p for p in sorted(glob.glob(os.path.join(results, "kernel_bench*.json")))
                      if load(p).get("commit") == commit), None)
    if ours_path is None:
        raise ResultsError(f"{os.path.basename(peer_path)}: no kernel_bench*.json has its field "
                           f"'commit' ({commit}): the two must come from one device call")
    ours = load(ours_path)
    fields = ("format", "op", "shard_mib", "median_us")
    peer_us = {(r["format"], r["op"], r["shard_mib"]): r["median_us"]
               for r in rows_by(peer, peer_path, fields) if r["op"] != "d2d_copy"}
    ours_us = {(r["format"], r["op"], r["shard_mib"]): r["median_us"]
               for r in rows_by(ours, ours_path, fields)}
    keys = [k for k in peer_us if k in ours_us]
    if not keys:
        raise ResultsError(f"{os.path.basename(peer_path)}: no (format, op, shard_mib) row matches "
                           f"{os.path.basename(ours_path)}")
    sizes = sorted({k[2] for k in keys})
    paths = list(dict.fromkeys((k[0], k[1]) for k in keys))
    fig = figure(plt, "Against the torch.compile peer: peer time / our time, same device call "
                 "(higher is better; pack rows: both compute their own amax)",
                 [source_line(ours, ours_path),
                  source_line(peer, peer_path) + f"; torch {peer.get('torch', '?')}"])
    ax = fig.add_axes([0.06, 0.22, 0.92, 0.63])
    x = np.arange(len(paths))
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        ratio = [peer_us.get((f, o, size), np.nan) / ours_us.get((f, o, size), np.nan)
                 for f, o in paths]
        ax.bar(x + (i - (len(sizes) - 1) / 2) * width, ratio, width, label=f"{size} MiB shard")
    ax.set_yscale("log")
    ax.set_ylim(0.5, max(peer_us[k] / ours_us[k] for k in keys) * 2)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.axhline(2, color="red", linestyle="--", linewidth=0.8, label="target 2x")
    ax.set_xticks(x, [f"{f} {o}" for f, o in paths], rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("peer time / our time (log)")
    ax.legend(fontsize=8, ncol=len(sizes) + 1, loc="upper right")
    return save(fig, out, "kernels_vs_peer.png")


def plot_overlap(plt, np, results, out):
    paths = sorted(glob.glob(os.path.join(results, "overlap_*.json")))
    if not paths:
        raise ResultsError(f"no overlap_*.json in {results}")
    labels, ratios, exposed, sources = [], [], [], []
    for path in paths:
        doc = load(path)
        mb = need(doc, "sizing.microbatches", path)
        sources.append(source_line(doc, path))
        for i, c in enumerate(need(doc, "configs", path)):
            where = f"{path} configs[{i}]"
            if need(c, "mode", where) != "gtp":
                continue
            flags = []
            if c.get("keep_gathered"):
                flags.append("keep")
            if "grads_into_main_grad" in c:
                flags.append("into main grad " + ("on" if c["grads_into_main_grad"] else "off"))
            labels.append(f"{need(c, 'wire', where)} depth {need(c, 'prefetch_depth', where)} B={mb} "
                          f"{c.get('stream_priority', '')} {', '.join(flags)}".strip())
            ratios.append(need(c, "step_ratio_vs_resident", where))
            exposed.append(need(c, "exposed_pct_of_step", where))
    fig = figure(plt, "Overlap benchmark, one GPU: GTP-on / GTP-off step time and exposed "
                 "communication (lower is better; depth 0 = every gather on demand)", sources)
    y = np.arange(len(labels))
    top = 0.86 - 0.025 * len(sources)
    for k, (values, name, target, unit) in enumerate(
            ((ratios, "step time, GTP on / off", 1.03, "x"),
             (exposed, "exposed communication, % of step", 3.0, " %"))):
        ax = fig.add_axes([0.30 + k * 0.36, 0.08, 0.31, top - 0.08])
        ax.barh(y, values, color="tab:blue" if k == 0 else "tab:orange")
        ax.axvline(target, color="red", linestyle="--", linewidth=0.8, label=f"target {target}{unit}")
        if k == 0:
            ax.axvline(1, color="black", linewidth=0.8)
            ax.set_xlim(min(0.95, min(values) - 0.02), max(values) + 0.05)
        ax.set_yticks(y, labels if k == 0 else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(name)
        ax.legend(fontsize=8, loc="lower right")
        for yi, v in zip(y, values):
            ax.text(v, yi, f" {v:.3f}" if k == 0 else f" {v:.2f}", va="center", fontsize=7)
    return save(fig, out, "overlap.png")


def plot_collectives(plt, np, results, out):
    paths = sorted(glob.glob(os.path.join(results, "comm_*.json")))
    if not paths:
        raise ResultsError(f"no comm_*.json in {results}")
    sources = {}
    for path in paths:
        doc = load(path)
        key = f"{machine_text(doc, path)}; commit {need(doc, 'commit', path)}"
        sources.setdefault(key, []).append(os.path.basename(path))
    fig = figure(plt, "Collectives (gtp-bench): libgtp's stream against raw NCCL, and the wire "
                 "formats end to end against the BF16 gather",
                 [f"{names[0] if len(names) == 1 else f'{len(names)} comm_*.json files'}: {key}"
                  for key, names in sources.items()])
    ax_bw = fig.add_axes([0.06, 0.10, 0.27, 0.70])
    ax_ratio = fig.add_axes([0.39, 0.10, 0.27, 0.70])
    ax_wire = fig.add_axes([0.72, 0.10, 0.26, 0.70])
    one_rank = False
    for path in paths:
        doc = load(path)
        rows = rows_by(doc, path, ("path", "size", "algbw_gbps", "busbw_gbps"))
        name = f"{need(doc, 'collective', path)} {os.path.basename(path)[5:-5]}"
        factor = need(doc, "busbw_factor", path)
        one_rank = one_rank or factor == 0
        bw = "algbw_gbps" if factor == 0 else "busbw_gbps"
        for kind, style in (("nccl", "-"), ("gtp_stream", "--")):
            sel = [r for r in rows if r["path"] == kind]
            if sel and need(doc, "format", path) in ("", None):
                ax_bw.plot([r["size"] for r in sel], [r[bw] for r in sel], style, marker="o",
                           markersize=3, label=f"{name} {kind}")
        sel = [r for r in rows if r["path"] == "gtp_stream" and "bw_ratio_to_nccl" in r]
        if sel and need(doc, "format", path) in ("", None):
            ax_ratio.plot([r["size"] for r in sel], [r["bw_ratio_to_nccl"] for r in sel], marker="o",
                          markersize=3, label=name)
        wire = [r for r in rows if r["path"] == "gtp_wire"]
        for i, r in enumerate(wire):
            need(r, "e2e_ratio_to_bf16", f"{path} gtp_wire row {i}")
        if wire:
            ax_wire.plot([r["size"] for r in wire], [r["e2e_ratio_to_bf16"] for r in wire],
                         marker="o", markersize=3, label=need(doc, "format", path))
    ax_bw.set_ylabel("algbw GB/s (one rank: busbw is 0 by definition)" if one_rank else "busbw GB/s")
    ax_ratio.set_ylabel("libgtp stream / raw NCCL bandwidth")
    ax_ratio.axhline(0.97, color="red", linestyle="--", linewidth=0.8, label="target 0.97 (>= 64 MiB)")
    ax_ratio.axvline(64 << 20, color="grey", linewidth=0.5)
    ax_wire.set_ylabel("BF16 gather time / wire pack+gather+unpack time")
    ax_wire.axhline(1, color="black", linewidth=0.8)
    for ax in (ax_bw, ax_ratio, ax_wire):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.legend(fontsize=7)
    return save(fig, out, "collectives.png")


def plot_te_stack(plt, np, results, out):
    path = os.path.join(results, "te_stack_bench.json")
    if not os.path.exists(path):
        raise ResultsError(f"no te_stack_bench.json in {results}")
    doc = load(path)
    labels, ratios, memory = [], [], []
    for i, c in enumerate(need(doc, "configs", path)):
        where = f"{path} configs[{i}]"
        labels.append(f"{need(c, 'mode', where)} ({need(c, 'wire', where)} wire) B={need(c, 'microbatches', where)} "
                      f"keep {'on' if need(c, 'keep_gathered', where) else 'off'}")
        ratios.append(need(c, "step_ratio", where))
        memory.append(need(c, "libgtp_peak_bytes", where) / 2**20)
    title = (f"TransformerEngine stack: {need(doc, 'layers', path)} x te.Linear({need(doc, 'hidden', path)}), "
             f"{need(doc, 'tokens_per_microbatch', path)} tokens per microbatch, G = 1: libgtp on / off")
    fig = figure(plt, title, [source_line(doc, path)])
    y = np.arange(len(labels))
    for k, (values, name) in enumerate(((ratios, "step time, libgtp on / TE alone"),
                                        (memory, "libgtp's peak memory, MiB"))):
        ax = fig.add_axes([0.25 + k * 0.39, 0.08, 0.33, 0.72])
        ax.barh(y, values, color="tab:blue" if k == 0 else "tab:green")
        if k == 0:
            ax.axvline(1.03, color="red", linestyle="--", linewidth=0.8, label="target 1.03 (B=4, keep on)")
            ax.axvline(1, color="black", linewidth=0.8)
            ax.set_xlim(0.95, max(values) + 0.08)
            ax.legend(fontsize=8, loc="lower right")
        ax.set_yticks(y, labels if k == 0 else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(name)
        for yi, v in zip(y, values):
            ax.text(v, yi, f" {v:.3f}" if k == 0 else f" {v:.0f}", va="center", fontsize=7)
    return save(fig, out, "te_stack.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, help="folder with the results JSON")
    parser.add_argument("--out", required=True, help="folder for the PNG files (created)")
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError as e:
        print(f"plot_results.py: error: {e} (pip install -c tools/constraints.txt matplotlib numpy)",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    try:
        for plot in (plot_kernels, plot_peer, plot_overlap, plot_collectives, plot_te_stack):
            print(f"wrote {plot(plt, np, args.results, args.out)}")
            plt.close("all")
    except ResultsError as e:
        print(f"plot_results.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

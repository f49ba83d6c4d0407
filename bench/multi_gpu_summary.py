#!/usr/bin/env python3
"""The summary of the GPU runner's multi-GPU steps (tools/gpu/run.sh multi_gpu, issue 7): reads the JSON files one multi-GPU run wrote into
a folder and prints one table per question, each figure next to its target, then writes the same as
JSON (multi_gpu_summary.json in that folder, or --json PATH).

Files read (G = the group size, written by the mg_ steps; a missing file is reported as "not run"):
  ag_bf16_g{G}.json, rs_fp32_g{G}.json   gtp-bench all_gather (BF16) / reduce_scatter (FP32 sum):
                                          rows `nccl` (raw) and `gtp_stream` (libgtp's streams)
  ag_wire_{fmt}_g{G}.json                gtp-bench all_gather --format fmt: rows nccl, gtp_stream, gtp_wire
  fsdp2_g{G}.json                        bench/peers/fsdp2_allgather_peer.py: rows `fsdp2`
  overlap_g{G}.json, overlap_mb4_g{G}.json   gtp-overlap-bench under gtp-launch
  overlap_mb4_keep_g{G}.json             the same, 4 microbatches, keep_gathered, re-packed every step
  train_gpt_g{G}.json                    train_gpt.py --backend cuda (with --reshard-to)
  train_gpt_fill_graphs_g{G}.json        train_gpt.py --backend cuda --fill-graphs (BF16, FP8)

Targets (issue 7): libgtp's busbw >= 97 % of raw NCCL's at >= 64 MiB; wire end to end vs the BF16
gather >= 1.8x for fp8 / mxfp8 and >= 3x for nvfp4 at >= 256 MiB; exposed communication <= 3 % of
the step and GTP-on / GTP-off <= 1.03; loss parity within each wire's bound; re-shard load exact.
usage: multi_gpu_summary.py DIR [--json PATH]
"""
import argparse
import glob
import json
import os
import re
import sys

MIB = 1 << 20
BUSBW_SIZES = [64 * MIB, 256 * MIB, 1024 * MIB]
WIRE_SIZES = [256 * MIB, 1024 * MIB, 4096 * MIB]
BUSBW_TARGET = 0.97
WIRE_TARGETS = {"fp8": 1.8, "mxfp8": 1.8, "nvfp4": 3.0}
EXPOSED_TARGET_PCT = 3.0
STEP_RATIO_TARGET = 1.03


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def group_sizes(folder):
    """Every G some file of the run was written for, largest first."""
    found = {int(m.group(1)) for p in glob.glob(os.path.join(folder, "*_g*.json"))
             if (m := re.search(r"_g(\d+)\.json$", p))}
    return sorted(found, reverse=True)


def row_at(doc, path, size):
    """The row of `path` whose size is `size` (gtp-bench rounds sizes down to whole rows per rank:
    the closest within 10 %), or None."""
    rows = [r for r in doc["results"] if r["path"] == path and abs(r["size"] - size) <= 0.1 * size]
    return min(rows, key=lambda r: abs(r["size"] - size)) if rows else None


def mib(size):
    return f"{size // MIB} MiB" if size < 1024 * MIB else f"{size // (1024 * MIB)} GiB"


def fmt(value, spec=".1f", missing="-"):
    return missing if value is None else format(value, spec)


def verdict(ok):
    return "-" if ok is None else ("met" if ok else "MISSED")


def collectives(folder, g):
    """busbw of raw NCCL, libgtp's stream and FSDP2 at 64 MiB / 256 MiB / 1 GiB, per collective."""
    out = []
    fsdp2 = load(folder, f"fsdp2_g{g}.json")
    for collective, name in (("all_gather bf16", f"ag_bf16_g{g}.json"), ("reduce_scatter fp32", f"rs_fp32_g{g}.json")):
        doc = load(folder, name)
        for size in BUSBW_SIZES:
            entry = {"collective": collective, "group_size": g, "size": size, "run": doc is not None}
            if doc is not None:
                nccl, gtp = row_at(doc, "nccl", size), row_at(doc, "gtp_stream", size)
                if nccl and gtp:
                    entry.update(nccl_busbw=nccl["busbw_gbps"], gtp_busbw=gtp["busbw_gbps"],
                                 ratio=gtp["algbw_gbps"] / nccl["algbw_gbps"])
                    entry["target_met"] = entry["ratio"] >= BUSBW_TARGET
            if collective.startswith("all_gather") and fsdp2 is not None:
                peer = row_at(fsdp2, "fsdp2", size)
                if peer:
                    entry["fsdp2_busbw"] = peer["busbw_gbps"]
                    if "gtp_busbw" in entry and peer["busbw_gbps"] > 0:
                        entry["gtp_vs_fsdp2"] = entry["gtp_busbw"] / peer["busbw_gbps"]
            out.append(entry)
    return out


def wires(folder, g):
    out = []
    fsdp2 = load(folder, f"fsdp2_g{g}.json")
    for wire, target in WIRE_TARGETS.items():
        doc = load(folder, f"ag_wire_{wire}_g{g}.json")
        for size in WIRE_SIZES:
            entry = {"wire": wire, "group_size": g, "size": size, "run": doc is not None, "target": target}
            row = row_at(doc, "gtp_wire", size) if doc is not None else None
            if row:
                entry.update({k: row[k] for k in ("wire_bytes", "pack_us", "gather_us", "unpack_us", "e2e_us",
                                                  "e2e_ratio_to_bf16", "wrong")})
                bf16 = row_at(doc, "nccl", size)
                entry["bf16_gather_us"] = bf16["time_us"] if bf16 else None
                entry["target_met"] = row["e2e_ratio_to_bf16"] >= target
                peer = row_at(fsdp2, "fsdp2", size) if fsdp2 is not None else None
                if peer:  # perf-anchors: GTP's FP8 gather pipeline >= 1.4x FSDP2's BF16 gather (reference)
                    entry["fsdp2_us"], entry["vs_fsdp2"] = peer["time_us"], peer["time_us"] / row["e2e_us"]
            out.append(entry)
    return out


def overlap(folder, g):
    out = []
    for name, label in ((f"overlap_g{g}.json", "B = 1"), (f"overlap_mb4_g{g}.json", "B = 4"),
                        (f"overlap_mb4_keep_g{g}.json", "B = 4, keep_gathered")):
        doc = load(folder, name)
        if doc is None:
            out.append({"file": name, "microbatches": label, "group_size": g, "run": False})
            continue
        for c in doc["configs"]:
            if c.get("mode") != "gtp" or c.get("reference"):
                continue
            entry = {"file": name, "microbatches": label, "group_size": g, "run": True, "wire": c["wire"],
                     "priority": c["stream_priority"], "depth": c["prefetch_depth"]}
            if "error" in c:
                entry["error"] = c["error"]
            else:
                entry.update(step_us=c["step_us"]["median"], exposed_pct=c["exposed_pct_of_step"],
                             overlap_pct=c.get("overlap_pct"), step_ratio=c["step_ratio_vs_resident"],
                             peak_mib=c["peak_memory_bytes"] / MIB)
                entry["target_met"] = (c["exposed_pct_of_step"] <= EXPOSED_TARGET_PCT and
                                       c["step_ratio_vs_resident"] <= STEP_RATIO_TARGET)
            out.append(entry)
    return out


def training(folder, g):
    doc = load(folder, f"train_gpt_g{g}.json")
    if doc is None:
        return {"group_size": g, "run": False}
    runs = [{"run": name, "last_loss": r["last_loss"], "gap": r.get("max_relative_loss_gap"),
             "bound": r.get("bound"), "within_bound": r.get("within_bound"),
             "seconds_per_step": r["seconds_per_step"]} for name, r in doc["runs"].items()]
    return {"group_size": g, "run": True, "runs": runs, "parity_ok": doc["parity_ok"],
            "loss_decreased": doc["loss_decreased"], "reshard": doc.get("reshard")}


def fill_graph_training(folder, g):
    """train_gpt.py --fill-graphs over G GPUs: parity with GTP off, and whether the dense group's fills
    ran as launches of recorded CUDA graphs (captured NCCL collectives across ranks)."""
    doc = load(folder, f"train_gpt_fill_graphs_g{g}.json")
    if doc is None:
        return {"group_size": g, "run": False}
    runs = []
    for name, r in doc["runs"].items():
        if name == "off":
            continue
        dense = r["stats"]["groups"][0]
        runs.append({"run": name, "within_bound": r.get("within_bound"), "graph_fills": dense["graph_fills"],
                     "graph_recordings": dense["graph_recordings"],
                     "target_met": bool(r.get("within_bound")) and dense["graph_fills"] > dense["graph_recordings"] > 0})
    return {"group_size": g, "run": True, "parity_ok": doc["parity_ok"], "runs": runs}


def summarize(folder):
    gs = group_sizes(folder)
    summary = {"group_sizes": gs,
            "targets": {"busbw_ratio_to_nccl": BUSBW_TARGET, "wire_e2e_vs_bf16": WIRE_TARGETS,
                        "exposed_pct_of_step": EXPOSED_TARGET_PCT, "step_ratio_vs_resident": STEP_RATIO_TARGET},
            "collectives": [e for g in gs for e in collectives(folder, g)],
            "wires": [e for g in gs for e in wires(folder, g)],
            "overlap": [e for g in gs for e in overlap(folder, g)],
            "training": [training(folder, g) for g in gs
                         if os.path.exists(os.path.join(folder, f"train_gpt_g{g}.json"))],
            "fill_graphs": [fill_graph_training(folder, g) for g in gs
                            if os.path.exists(os.path.join(folder, f"train_gpt_fill_graphs_g{g}.json"))]}
    summary["verdicts"] = verdicts(summary)
    return summary


def verdicts(s):
    """Per question: how many measured points met their target, of how many measured."""
    def count(entries):
        measured = [e["target_met"] for e in entries if "target_met" in e]
        return {"met": sum(measured), "measured": len(measured)}
    train_ok = [t["parity_ok"] and t["loss_decreased"] for t in s["training"]]
    return {"busbw": count(s["collectives"]), "wire": count(s["wires"]), "overlap": count(s["overlap"]),
            "training": {"met": sum(train_ok), "measured": len(train_ok)},
            "fill_graphs": count([r for t in s["fill_graphs"] for r in t["runs"]])}


def once(lines, line):
    """Appends a "not run" line unless it is already the last one (one per missing file)."""
    if not lines or lines[-1] != line:
        lines.append(line)


def render(s):
    lines = [f"== multi-GPU summary: group sizes {s['group_sizes'] or 'none found'}",
             "", "busbw (GB/s), libgtp's stream vs raw NCCL (target >= 97 % at >= 64 MiB), FSDP2 peer alongside",
             f"{'collective':<20} {'G':>2} {'size':>8} {'NCCL':>8} {'libgtp':>8} {'ratio':>6} {'target':>7}"
             f" {'FSDP2':>8} {'gtp/FSDP2':>9}"]
    for e in s["collectives"]:
        if not e["run"]:
            once(lines, f"{e['collective']:<20} {e['group_size']:>2}  not run")
            continue
        lines.append(f"{e['collective']:<20} {e['group_size']:>2} {mib(e['size']):>8} {fmt(e.get('nccl_busbw')):>8}"
                     f" {fmt(e.get('gtp_busbw')):>8} {fmt(e.get('ratio'), '.3f'):>6} {verdict(e.get('target_met')):>7}"
                     f" {fmt(e.get('fsdp2_busbw')):>8} {fmt(e.get('gtp_vs_fsdp2'), '.2f'):>9}")
    lines += ["", "wire end to end (pack + gather + unpack) vs the BF16 gather of the same weight "
                  "(targets: fp8/mxfp8 >= 1.8x, nvfp4 >= 3x at >= 256 MiB)",
              f"{'wire':<6} {'G':>2} {'size':>8} {'pack':>8} {'gather':>8} {'unpack':>8} {'e2e us':>8}"
              f" {'BF16 us':>8} {'vs BF16':>7} {'target':>7} {'FSDP2 us':>8} {'vs FSDP2':>8}"]
    for e in s["wires"]:
        if not e["run"]:
            once(lines, f"{e['wire']:<6} {e['group_size']:>2}  not run")
            continue
        if "e2e_us" not in e:
            lines.append(f"{e['wire']:<6} {e['group_size']:>2} {mib(e['size']):>8}  no row of this size")
            continue
        lines.append(f"{e['wire']:<6} {e['group_size']:>2} {mib(e['size']):>8} {e['pack_us']:>8.1f}"
                     f" {e['gather_us']:>8.1f} {e['unpack_us']:>8.1f} {e['e2e_us']:>8.1f} {fmt(e['bf16_gather_us']):>8}"
                     f" {e['e2e_ratio_to_bf16']:>6.2f}x {verdict(e['target_met']):>7} {fmt(e.get('fsdp2_us')):>8}"
                     f" {fmt(e.get('vs_fsdp2'), '.2f'):>7}x")
    lines += ["", "overlap (gtp-overlap-bench, G = ranks; targets: exposed <= 3 % of step, GTP-on / off <= 1.03)",
              f"{'B':<6} {'G':>2} {'wire':<6} {'prio':<6} {'depth':>5} {'step us':>9} {'exposed %':>9}"
              f" {'overlap %':>9} {'on/off':>6} {'target':>7}"]
    for e in s["overlap"]:
        if not e["run"]:
            lines.append(f"{e['microbatches']:<6} {e['group_size']:>2}  not run ({e['file']})")
        elif "error" in e:
            lines.append(f"{e['microbatches']:<6} {e['group_size']:>2} {e['wire']:<6} {e['priority']:<6}"
                         f" {e['depth']:>5}  error: {e['error']}")
        else:
            lines.append(f"{e['microbatches']:<6} {e['group_size']:>2} {e['wire']:<6} {e['priority']:<6}"
                         f" {e['depth']:>5} {e['step_us']:>9.1f} {e['exposed_pct']:>9.2f}"
                         f" {fmt(e['overlap_pct'], '.1f'):>9} {e['step_ratio']:>6.3f} {verdict(e['target_met']):>7}")
    lines += ["", "training (train_gpt.py, CUDA backend): loss parity with GTP off, re-shard load"]
    if not s["training"]:
        lines.append("  not run")
    for t in s["training"]:
        lines.append(f"G = {t['group_size']}: parity {'ok' if t['parity_ok'] else 'FAILED'}, loss decreased "
                     f"{'yes' if t['loss_decreased'] else 'NO'}")
        for r in t["runs"]:
            lines.append(f"  {r['run']:<6} last loss {r['last_loss']:.4f}  max gap {fmt(r['gap'], '.4g')}"
                         f" (bound {fmt(r['bound'], 'g')}) {verdict(r['within_bound'])}"
                         f"  {r['seconds_per_step']:.3f} s/step")
        rs = t["reshard"]
        if rs is None:
            lines.append("  re-shard load: not run")
        else:
            lines.append(f"  re-shard load G = {rs['from_g']} -> {rs['to_g']} ({rs['wire']}, {rs['steps']} steps):"
                         f" shards {'equal the checkpoint' if rs['shards_match_checkpoint'] else 'DIFFER'},"
                         f" max gap {rs['max_relative_loss_gap']:.4g} (bound {rs['bound']:g})"
                         f" {verdict(rs['within_bound'])}")
    lines += ["", "training with fill graphs (train_gpt.py --fill-graphs): parity, fills launched as graphs"]
    if not s["fill_graphs"]:
        lines.append("  not run")
    for t in s["fill_graphs"]:
        lines.append(f"G = {t['group_size']}: parity {'ok' if t['parity_ok'] else 'FAILED'}")
        for r in t["runs"]:
            lines.append(f"  {r['run']:<6} {r['graph_fills']} graph fills of {r['graph_recordings']} recordings"
                         f" {verdict(r['target_met'])}")
    lines += ["", "targets met / measured: " + ", ".join(f"{k} {v['met']}/{v['measured']}"
                                                      for k, v in s["verdicts"].items())]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", help="the folder holding the run's JSON files")
    parser.add_argument("--json", help="write the summary here (default FOLDER/multi_gpu_summary.json)")
    args = parser.parse_args()
    if not os.path.isdir(args.folder):
        parser.error(f"{args.folder} is not a folder; give the multi_gpu folder the mg_ steps wrote")
    summary = summarize(args.folder)
    sys.stdout.write(render(summary))
    with open(args.json or os.path.join(args.folder, "multi_gpu_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

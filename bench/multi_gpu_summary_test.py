#!/usr/bin/env python3
"""bench/multi_gpu_summary.py on synthetic JSON files shaped like gtp-bench's, the FSDP2 peer's,
gtp-overlap-bench's and train_gpt.py's: every figure lands in its table with the right verdict, and
missing files read as "not run"."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multi_gpu_summary as summary  # noqa: E402

MIB = 1 << 20


def bench_row(path, size, algbw, n, **extra):
    return {"size": size, "count": size // 2, "type": "bfloat16", "redop": "none", "time_us": size / 1e3 / algbw,
            "algbw_gbps": algbw, "busbw_gbps": algbw * (n - 1) / n, "wrong": -1, "path": path, **extra}


def gtp_bench(rows, n):
    return {"collective": "all_gather", "group_size": n, "busbw_factor": (n - 1) / n, "results": rows}


def wire_row(size, bf16_us, ratio):
    e2e = bf16_us / ratio
    return bench_row("gtp_wire", size, size / 1e3 / e2e, 8, wire_bytes=size // 2, pack_us=e2e * 0.3,
                     gather_us=e2e * 0.4, unpack_us=e2e * 0.3, e2e_us=e2e, e2e_ratio_to_bf16=ratio)


def overlap_config(wire, depth, exposed_pct, ratio, reference=False, error=None):
    c = {"mode": "gtp", "wire": wire, "stream_priority": "high", "prefetch_depth": depth, "reference": reference}
    if error:
        c["error"] = error
    else:
        c.update(step_us={"median": 1000.0 * ratio, "min": 0, "max": 0}, exposed_pct_of_step=exposed_pct,
                 overlap_pct=90.0, step_ratio_vs_resident=ratio, peak_memory_bytes=3 * MIB)
    return c


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.mkdtemp()
        ag = [bench_row("nccl", 64 * MIB, 100.0, 8), bench_row("gtp_stream", 64 * MIB, 97.0, 8),   # 0.97: met
              bench_row("nccl", 256 * MIB, 100.0, 8), bench_row("gtp_stream", 256 * MIB, 96.0, 8),  # missed
              # rounded down to whole rows per rank (5 % short): still the 1 GiB point
              bench_row("nccl", int(0.95 * 1024 * MIB), 200.0, 8),
              bench_row("gtp_stream", int(0.95 * 1024 * MIB), 200.0, 8)]
        self.write("ag_bf16_g8.json", gtp_bench(ag, 8))
        self.write("ag_bf16_g4.json", gtp_bench([bench_row("nccl", 64 * MIB, 50.0, 4),
                                                 bench_row("gtp_stream", 64 * MIB, 49.0, 4)], 4))
        self.write("fsdp2_g8.json", gtp_bench([bench_row("fsdp2", 64 * MIB, 80.0, 8),
                                               bench_row("fsdp2", 256 * MIB, 50.0, 8)], 8))
        fp8 = [bench_row("nccl", 256 * MIB, 100.0, 8), wire_row(256 * MIB, 256 * MIB / 1e5, 2.0),
               bench_row("nccl", 1024 * MIB, 100.0, 8), wire_row(1024 * MIB, 1024 * MIB / 1e5, 1.7)]
        self.write("ag_wire_fp8_g8.json", gtp_bench(fp8, 8))
        self.write("ag_wire_nvfp4_g8.json", gtp_bench([bench_row("nccl", 256 * MIB, 100.0, 8),
                                                       wire_row(256 * MIB, 256 * MIB / 1e5, 3.2)], 8))
        self.write("overlap_g8.json", {"configs": [
            {"mode": "resident", "step_us": {"median": 1000.0}, "exposed_pct_of_step": 0.0},
            overlap_config("bf16", 0, 30.0, 1.3, reference=True),
            overlap_config("bf16", 1, 2.5, 1.02), overlap_config("nvfp4", 1, 4.0, 1.02),
            overlap_config("fp8", 1, 0, 0, error="gtp_materialize: timed out")]})
        self.write("overlap_mb4_keep_g8.json", {"configs": [overlap_config("bf16", 2, 1.5, 1.025)]})
        self.write("train_gpt_g8.json", {
            "parity_ok": True, "loss_decreased": True,
            "runs": {"off": {"last_loss": 1.5, "seconds_per_step": 0.02},
                     "bf16": {"last_loss": 1.5001, "max_relative_loss_gap": 2e-4, "bound": 1e-3, "within_bound": True,
                              "seconds_per_step": 0.03}},
            "reshard": {"from_g": 8, "to_g": 4, "wire": "bf16", "steps": 10, "shards_match_checkpoint": True,
                        "max_relative_loss_gap": 1e-4, "bound": 1e-3, "within_bound": True}})
        dense = [{"graph_fills": 400, "graph_recordings": 12}, {"graph_fills": 0, "graph_recordings": 0}]
        self.write("train_gpt_fill_graphs_g8.json", {
            "parity_ok": False, "runs": {"off": {"last_loss": 1.5, "stats": None},
                                         "bf16": {"within_bound": True, "stats": {"groups": dense}},
                                         "fp8": {"within_bound": True, "stats": {"groups": dense[1:]}}}})

    def write(self, name, doc):
        with open(os.path.join(self.folder, name), "w") as f:
            json.dump(doc, f)

    def test_every_figure_against_its_target(self):
        s = summary.summarize(self.folder)
        self.assertEqual(s["group_sizes"], [8, 4])
        ag8 = {e["size"]: e for e in s["collectives"] if e["collective"] == "all_gather bf16" and e["group_size"] == 8}
        self.assertAlmostEqual(ag8[64 * MIB]["ratio"], 0.97)
        self.assertTrue(ag8[64 * MIB]["target_met"])
        self.assertAlmostEqual(ag8[64 * MIB]["nccl_busbw"], 87.5)
        self.assertAlmostEqual(ag8[64 * MIB]["fsdp2_busbw"], 70.0)
        self.assertAlmostEqual(ag8[64 * MIB]["gtp_vs_fsdp2"], 97.0 / 80.0)
        self.assertFalse(ag8[256 * MIB]["target_met"])
        self.assertTrue(ag8[1024 * MIB]["target_met"], "the 5 % short row is the 1 GiB point")
        self.assertAlmostEqual(ag8[256 * MIB]["fsdp2_busbw"], 50.0 * 7 / 8)
        self.assertNotIn("fsdp2_busbw", ag8[1024 * MIB])
        rs8 = [e for e in s["collectives"] if e["collective"].startswith("reduce") and e["group_size"] == 8]
        self.assertTrue(rs8 and not any(e["run"] for e in rs8))
        wires = {(e["wire"], e["size"]): e for e in s["wires"] if e["group_size"] == 8}
        self.assertTrue(wires[("fp8", 256 * MIB)]["target_met"])
        self.assertFalse(wires[("fp8", 1024 * MIB)]["target_met"])
        self.assertTrue(wires[("nvfp4", 256 * MIB)]["target_met"])
        self.assertAlmostEqual(wires[("fp8", 256 * MIB)]["bf16_gather_us"], 256 * MIB / 1e5)
        self.assertFalse(wires[("mxfp8", 256 * MIB)]["run"])
        # FSDP2 at 50 GB/s algbw vs the fp8 wire's e2e at 2x a 100 GB/s BF16 gather: 4x
        self.assertAlmostEqual(wires[("fp8", 256 * MIB)]["vs_fsdp2"], 4.0)
        self.assertNotIn("vs_fsdp2", wires[("fp8", 1024 * MIB)])
        gtp = [e for e in s["overlap"] if e["run"]]
        self.assertEqual([(e["microbatches"], e["wire"], e.get("target_met")) for e in gtp],
                         [("B = 1", "bf16", True), ("B = 1", "nvfp4", False), ("B = 1", "fp8", None),
                          ("B = 4, keep_gathered", "bf16", True)], "reference and resident rows skipped")
        self.assertEqual(gtp[2]["error"], "gtp_materialize: timed out")
        self.assertEqual(s["training"][0]["reshard"]["to_g"], 4)
        fills = {r["run"]: r["target_met"] for r in s["fill_graphs"][0]["runs"]}
        self.assertEqual(fills, {"bf16": True, "fp8": False}, "no graph fill is a miss")
        self.assertEqual(s["verdicts"], {"busbw": {"met": 3, "measured": 4}, "wire": {"met": 2, "measured": 3},
                                         "overlap": {"met": 2, "measured": 3}, "training": {"met": 1, "measured": 1},
                                         "fill_graphs": {"met": 1, "measured": 2}})

    def test_command_line_prints_the_tables_and_writes_json(self):
        out = subprocess.run([sys.executable, summary.__file__, self.folder], check=True, capture_output=True,
                             text=True).stdout
        self.assertIn("reduce_scatter fp32   8  not run", out)
        self.assertRegex(out, r"all_gather bf16 +8 +256 MiB +87\.5 +84\.0 +0\.960 +MISSED")
        self.assertRegex(out, r"nvfp4 +8 +256 MiB .* 3\.20x +met")
        self.assertIn("re-shard load G = 8 -> 4 (bf16, 10 steps): shards equal the checkpoint", out)
        self.assertIn("  bf16   400 graph fills of 12 recordings met", out)
        self.assertIn("targets met / measured: busbw 3/4, wire 2/3, overlap 2/3, training 1/1, fill_graphs 1/2", out)
        with open(os.path.join(self.folder, "multi_gpu_summary.json")) as f:
            self.assertEqual(json.load(f)["group_sizes"], [8, 4])

    def test_an_empty_folder_reads_as_nothing_run(self):
        empty = tempfile.mkdtemp()
        s = summary.summarize(empty)
        self.assertEqual((s["group_sizes"], s["training"]), ([], []))
        self.assertIn("group sizes none found", summary.render(s))


if __name__ == "__main__":
    unittest.main()

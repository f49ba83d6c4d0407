#!/usr/bin/env python3
"""bench/model: exact wire bytes, op counts per system, the exposure arithmetic of the step simulation,
a hand-computed collective, the calibration check and the errors bad inputs raise. Standard library only
(runs with unittest or pytest)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gtp_cost_model as gcm  # noqa: E402
import inputs as inp  # noqa: E402
import wire  # noqa: E402

MIB = 1 << 20


def costs(**override):
    values = inp.all_inputs()
    for k, v in override.items():
        values[k] = replace(values[k], value=v)
    return gcm.Costs(values)


class WireBytesTest(unittest.TestCase):
    def test_chunk_bytes_by_hand(self):
        # 8192 x 8192 over G = 8: 1024 rows a rank. Sections 256-byte aligned (docs/formats.md).
        self.assertEqual(wire.libgtp_chunk_bytes(8192, 8192, 8, "bf16"), 2 * 1024 * 8192)
        self.assertEqual(wire.libgtp_chunk_bytes(8192, 8192, 8, "fp8"), 1024 * 8192 + 256)
        self.assertEqual(wire.libgtp_chunk_bytes(8192, 8192, 8, "mxfp8"), 1024 * 8192 + 1024 * 256)
        self.assertEqual(wire.libgtp_chunk_bytes(8192, 8192, 8, "nvfp4"), 512 * 8192 + 64 * 512 + 256)
        self.assertEqual(wire.libgtp_chunk_bytes(8192, 8192, 8, "nvfp4", nvfp4_2d=False),
                         512 * 8192 + 1024 * 512 + 256)

    def test_padding(self):
        # 1000 rows over G = 8: padded to 1024 (16 x 8), 128 a rank; MXFP8 to 1024 as well (32 x 8).
        self.assertEqual(wire.shard_rows(1000, 4096, 8, "bf16"), 128)
        self.assertEqual(wire.shard_rows(1000, 4096, 8, "mxfp8"), 128)
        self.assertEqual(wire.shard_rows(1000, 4096, 64, "mxfp8"), 32)   # 2048 / 64
        self.assertEqual(wire.libgtp_chunk_bytes(1000, 4096, 8, "bf16"), 2 * 128 * 4096)

    def test_chunk_bytes_match_the_measured_wire_files(self):
        # gtp-bench --format wrote wire_bytes for a [rows, 4096] weight on one rank (nvfp4: 1x16 blocks).
        for fmt in wire.FORMATS:
            with open(os.path.join(inp.RESULTS_DIR, f"comm_all_gather_wire_{fmt}.json")) as f:
                rows = [r for r in json.load(f)["results"] if r["path"] == "gtp_wire"]
            self.assertTrue(rows)
            for r in rows:
                got = wire.libgtp_chunk_bytes(r["count"] // 4096, 4096, 1, fmt, nvfp4_2d=False)
                self.assertEqual(got, r["wire_bytes"], (fmt, r["size"]))

    def test_megatron_bytes_per_call(self):
        r = 1024  # 8192 rows over G = 8
        self.assertEqual(wire.megatron_op_bytes(8192, 8192, 8, "mxfp8", "fwd"), [r * 256, r * 8192])
        self.assertEqual(wire.megatron_op_bytes(8192, 8192, 8, "mxfp8", "bwd"), [(r // 32) * 8192, r * 8192])
        self.assertEqual(wire.megatron_op_bytes(8192, 8192, 8, "nvfp4", "fwd"), [r * 512, r * 4096])
        self.assertEqual(wire.megatron_op_bytes(8192, 8192, 8, "nvfp4", "bwd"), [8192 * 64, 8192 * 512])

    def test_more_ranks_more_bytes_relative(self):
        # What a rank receives, over the weight's own size, grows with G: (G-1)/G of the weight.
        for fmt in wire.FORMATS:
            full = wire.libgtp_chunk_bytes(8192, 8192, 1, fmt)
            received = [(g - 1) * wire.libgtp_chunk_bytes(8192, 8192, g, fmt) / full for g in (2, 4, 8, 16, 64)]
            self.assertEqual(received, sorted(received), fmt)
            self.assertTrue(all(x < 1.01 for x in received), fmt)
        c = costs()
        times = [c.collective(g, 1, 1, 64 * MIB) for g in (2, 4, 8, 16, 64)]
        self.assertEqual(times, sorted(times))


class OpCountTest(unittest.TestCase):
    def test_one_op_per_weight_against_two_to_four(self):
        for fmt in wire.FORMATS:
            for d in ("fwd", "bwd"):
                ops, _ = wire.gather_counts("libgtp", 8192, 8192, 8, fmt, d, fill_tag=False)
                self.assertEqual(ops, 1, fmt)
                ops16, _ = wire.gather_counts("libgtp", 1536, 4096, 2, fmt, d, count=16, fill_tag=False)
                self.assertEqual(ops16, 16, fmt)
        for fmt in ("mxfp8", "nvfp4"):
            self.assertEqual(wire.gather_counts("megatron", 8192, 8192, 8, fmt, "fwd")[0], 2)
            self.assertEqual(wire.gather_counts("megatron", 8192, 8192, 8, fmt, "bwd")[0], 2)
            self.assertEqual(wire.gather_counts("megatron", 8192, 8192, 8, fmt, "fwd", both_usages=True)[0], 4)
        self.assertEqual(wire.gather_counts("megatron", 8192, 8192, 8, "bf16", "fwd")[0], 1)

    def test_the_fill_tag_is_one_op_and_64_bytes_per_fill(self):
        plain = wire.gather_counts("libgtp", 8192, 8192, 8, "bf16", "fwd", fill_tag=False)
        tagged = wire.gather_counts("libgtp", 8192, 8192, 8, "bf16", "fwd", fill_tag=True)
        self.assertEqual((tagged[0] - plain[0], tagged[1] - plain[1]), (1, 64))
        self.assertEqual(wire.gather_counts("libgtp", 8192, 8192, 1, "bf16", "fwd"), (0, 0))


class SimulationTest(unittest.TestCase):
    def chain(self, n, c, m):
        return [[gcm.Entry(f"w{i}", "dense", compute=c, gather=m) for i in range(n)]]

    def test_exposed_is_zero_when_compute_dominates_and_comm_minus_compute_otherwise(self):
        n = 10
        for c, m in ((3.0, 1.0), (1.0, 3.0), (2.0, 2.0)):
            for depth in (1, None):   # libgtp at depth 1; Megatron (head on demand, one ahead)
                step, compute = gcm.simulate(self.chain(n, c, m), depth)
                self.assertEqual(compute, n * c)
                # the first gather has nothing to hide behind; each later one exposes max(0, m - c)
                self.assertAlmostEqual(step - compute, m + (n - 1) * max(0.0, m - c), places=12)

    def test_depth_hides_an_uneven_weight(self):
        # A big gather after a short GEMM: one ahead exposes it, two ahead hides it behind two GEMMs.
        phase = [[gcm.Entry("a", "dense", 4.0, 1.0), gcm.Entry("b", "dense", 1.0, 1.0),
                  gcm.Entry("c", "dense", 4.0, 3.0), gcm.Entry("d", "dense", 4.0, 1.0)]]
        step1, _ = gcm.simulate(phase, 1)
        step2, _ = gcm.simulate(phase, 2)
        # depth 1: a at 1 (head), b prefetched at 1 -> done 2 <= 5; c issued at 5 -> done 8, b ends 6: 2 exposed
        self.assertEqual(step1, 1 + 4 + 1 + 2 + 4 + 4)
        # depth 2: c issued when a starts (t = 1) after b's gather: done 5 <= 6; nothing more exposed
        self.assertEqual(step2, 1 + 4 + 1 + 4 + 4)

    def test_megatron_gathers_each_chain_head_on_demand(self):
        two = [[gcm.Entry("f0", "dense", 5.0, 1.0), gcm.Entry("f1", "dense", 5.0, 1.0)],
               [gcm.Entry("b0", "out_bwd", 5.0, 1.0), gcm.Entry("b1", "out_bwd", 5.0, 1.0)]]
        self.assertEqual(gcm.simulate(two, None)[0] - 20.0, 2.0)   # a head per phase
        self.assertEqual(gcm.simulate(two, 1)[0] - 20.0, 1.0)      # one per step

    def test_sync_reduce_scatter_holds_the_compute_stream(self):
        e = [[gcm.Entry("w", "dense", 1.0, 0.0, rs=2.0, rs_sync=True), gcm.Entry("v", "dense", 1.0)]]
        self.assertEqual(gcm.simulate(e, 1), (4.0, 2.0))
        e[0][0].rs_sync = False
        self.assertEqual(gcm.simulate(e, 1), (3.0, 2.0))


class CollectiveTest(unittest.TestCase):
    def test_hand_computed_collective(self):
        c = costs()
        # 8 ranks in one node: alpha = 6.6 + 7 x 0.6 = 10.8 us (NCCL Ring LL), busbw 361.4 GB/s.
        expected = 10.8e-6 + 7 * 16 * MIB / 361.4e9
        self.assertAlmostEqual(c.collective(8, 1, 1, 16 * MIB), expected, places=15)
        # two ops in one group, the second at full latency (grouped_op_latency_fraction 1.0)
        self.assertAlmostEqual(c.collective(8, 1, 2, 16 * MIB), expected + 10.8e-6, places=15)
        # 16 ranks over 2 nodes: 6.6 + 14 x 0.6 x 1.8 + 1 x 2.7 us, busbw 46 GB/s (NDR)
        self.assertAlmostEqual(c.collective(16, 1, 1, MIB), (6.6 + 14 * 0.6 * 1.8 + 2.7) * 1e-6 + 15 * MIB / 46e9,
                               places=15)
        self.assertEqual(c.collective(1, 1, 1, MIB), 0.0)

    def test_predict_runs_both_systems_and_refuses_megatron_mxfp8_on_h100(self):
        p = gcm.predict(gcm.Config("dense-70b", 8, "bf16", microbatches=1))
        self.assertTrue(p["megatron"]["available"])
        self.assertGreater(p["libgtp"]["step_s"], p["libgtp"]["compute_s"])
        self.assertEqual(p["megatron"]["gather_ops_per_microbatch"], 80 * 4 * 2 + 3)   # 1 op a gather
        self.assertEqual(p["libgtp"]["gather_ops_per_microbatch"], 2 * (80 * 4 * 2 + 3))  # + the tag
        q = gcm.predict(gcm.Config("dense-70b", 8, "mxfp8", microbatches=1))
        self.assertFalse(q["megatron"]["available"])

    def test_weak_scaling_starts_at_one(self):
        rows = gcm.weak_scaling(gcm.Config("dense-70b", 8, "bf16", microbatches=1), gpus=(128, 1024))
        self.assertEqual(rows[0]["libgtp_efficiency"], 1.0)
        self.assertLessEqual(rows[1]["megatron_efficiency"], 1.0)


class CalibrationTest(unittest.TestCase):
    def test_counts_match_and_mismatch(self):
        b = wire.libgtp_chunk_bytes(8192, 8192, 4, "mxfp8") + 64
        m = sum(wire.megatron_op_bytes(8192, 8192, 4, "mxfp8", "fwd"))
        measured = {"g": 4, "wire": "mxfp8", "weights": [
            {"name": "fc", "rows": 8192, "cols": 8192, "libgtp": {"ops": 2, "bytes": b},
             "megatron": {"ops": 2, "bytes": m + 1}}]}
        rows = gcm.check_counts(measured)
        self.assertEqual([r["ok"] for r in rows], [True, False])
        self.assertEqual(rows[1]["bytes_model"], m)

    def test_malformed_counts(self):
        with self.assertRaisesRegex(ValueError, "lack 'weights'"):
            gcm.check_counts({"g": 4, "wire": "bf16"})


class BadInputTest(unittest.TestCase):
    def test_errors_name_the_value_and_the_fix(self):
        with self.assertRaisesRegex(ValueError, r"unknown wire format 'int4'.*use one of"):
            wire.libgtp_chunk_bytes(8192, 8192, 8, "int4")
        with self.assertRaisesRegex(ValueError, r"G = 0 .*use 1, 2"):
            wire.shard_rows(8192, 8192, 0, "bf16")
        with self.assertRaisesRegex(ValueError, r"cols = 100 .*multiple of 32"):
            wire.shard_rows(8192, 100, 8, "mxfp8")
        with self.assertRaisesRegex(ValueError, r"gpus = 100 is not divisible by tp x g = 16.*multiple of 16"):
            gcm.predict(gcm.Config("dense-70b", 16, "bf16", gpus=100, microbatches=1))
        with self.assertRaisesRegex(ValueError, r"ep = 7 does not divide the 128 experts"):
            gcm.predict(gcm.Config("moe-235b", 8, "bf16", ep=7, eg=2, gpus=112, microbatches=1))
        with self.assertRaisesRegex(ValueError, r"bandwidth 0 B/s must be positive: set net.ib_busbw"):
            costs(**{"net.ib_busbw": 0}).collective(16, 1, 1, MIB)
        with self.assertRaisesRegex(ValueError, r"model = 'gpt5'"):
            gcm.predict(gcm.Config("gpt5", 8, "bf16"))

    def test_missing_results_folder(self):
        with self.assertRaisesRegex(ValueError, "is missing: pass results_dir"):
            inp.measured_inputs(tempfile.mkdtemp())


class InputTableTest(unittest.TestCase):
    def test_every_input_names_its_source_and_kind(self):
        for name, i in inp.all_inputs().items():
            self.assertIn(i.kind, ("measured", "published", "derived", "guess"), name)
            self.assertTrue(i.source.strip(), name)
            if i.kind == "measured":
                self.assertIn("bench/results/", i.source, name)
        mfu = inp.measured_inputs()["gemm.mfu.bf16"].value
        self.assertTrue(0.3 < mfu < 1.0, mfu)

    def test_cli_writes_the_json(self):
        out = os.path.join(tempfile.mkdtemp(), "m.json")
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            self.assertEqual(gcm.main(["--json", out, "--commit", "abc"]), 0)
        self.assertIn("| dense-70b | 8 | 1 | 1 | bf16 / bf16 |", printed.getvalue())
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual((doc["card"], doc["commit"]), ("none (model)", "abc"))
        self.assertEqual(len(doc["predictions"]), len(gcm.default_configs()))


if __name__ == "__main__":
    unittest.main()

"""CPU tests of the head-to-head's pure parts (h2h_plan, h2h_compare, the CLI) against the real
Megatron-Core 0.19.2: every variant's TransformerConfig through Megatron's own validation, the data
index against Megatron's own rank generator, verdicts and NCCL counts on constructed inputs.
The GPU runs themselves: docs/real-peers.md. Run: PYTHONPATH=bindings/python python3 -m pytest bench/megatron/h2h_test.py"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
torch = pytest.importorskip("torch", reason="torch is not installed (tools/setup.sh)")
pytest.importorskip("megatron.core", reason="megatron-core is not installed (tools/setup.sh)")

import h2h_compare as hc  # noqa: E402
import h2h_plan as hp  # noqa: E402

CASES = [(n, w, i) for n, v in hp.VARIANTS.items() for w in v.worlds for i in hp.IMPLS]


@pytest.mark.parametrize("name,world,impl", CASES)
def test_every_variant_config_passes_megatrons_validation_with_its_gtp_sizes(name, world, impl):
    variant = hp.VARIANTS[name]
    config = hp.transformer_config(variant, world, impl)
    layout = hp.layout(variant, world, impl)
    assert config.gtp_weight_remat_size == layout["gtp_remat_size"]
    assert config.expert_gtp_weight_remat_size == layout["expert_gtp_remat_size"]
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (variant.tp, variant.pp)
    assert config.virtual_pipeline_model_parallel_size == variant.vpp
    # gtp.megatron derives the same sizes from the same knobs (what use_libgtp reads back)
    sizes = hp.derived_sizes(variant, world, impl)
    assert (sizes.gtp, sizes.expert_gtp, sizes.ep) == (layout["gtp_remat_size"], layout["expert_gtp_remat_size"],
                                                       layout["expert_model_parallel_size"])
    if impl != "off":
        assert sizes.gtp >= 2 and sizes.dp == 1
    if variant.vpp:  # each virtual chunk gets whole layers
        assert variant.layers % (variant.pp * variant.vpp) == 0


def test_the_new_variants_are_what_the_issue_asks():
    moe, tp2, pp = hp.VARIANTS["moe"], hp.VARIANTS["tp2"], hp.VARIANTS["pp2vpp"]
    assert moe.moe and moe.config["moe_grouped_gemm"] and moe.expert_gtp == 2
    assert hp.layout(moe, 4, "libgtp")["expert_model_parallel_size"] == 2
    assert hp.layout(tp2, 4, "libgtp")["gtp_remat_size"] == 2 and tp2.tp == 2
    lay = hp.layout(pp, 4, "megatron")
    assert (lay["pipeline_model_parallel_size"], lay["virtual_pipeline_model_parallel_size"], lay["gtp_remat_size"]) \
        == (2, 2, 2)


def test_layout_refuses_a_world_the_variant_does_not_run_at():
    with pytest.raises(ValueError, match="use --world 4"):
        hp.layout(hp.VARIANTS["tp2"], 2, "libgtp")
    with pytest.raises(ValueError, match="impl 'nope'"):
        hp.layout(hp.VARIANTS["gpt"], 2, "nope")


def _rank_generator(variant, world, impl):
    from megatron.core import parallel_state as ps
    lay = hp.layout(variant, world, impl)
    model = variant.tp * variant.pp * lay["gtp_remat_size"]
    return ps.RankGenerator(tp=variant.tp, ep=1, dp=world // model, pp=variant.pp, cp=1,
                            order=ps._inject_gtp_remat_axis("tp-cp-ep-dp-pp", after="tp"),
                            gtp_remat=lay["gtp_remat_size"])


@pytest.mark.parametrize("name,world,impl", CASES)
def test_data_index_follows_megatrons_data_axis(name, world, impl):
    """TP and PP peers read the same data; along Megatron's data axis (DP, with G when on) the index
    counts 0, 1, ...: so a rank reads the same data in the three runs."""
    variant = hp.VARIANTS[name]
    gen = _rank_generator(variant, world, impl)
    for group in gen.get_ranks("tp-pp"):
        assert len({hp.data_index(r, variant, world) for r in group}) == 1, group
    axis = "gtp_remat-dp" if impl != "off" else "dp"
    for group in gen.get_ranks(axis):
        assert [hp.data_index(r, variant, world) for r in group] == list(range(len(group))), group


def test_expert_gtp_groups_are_megatrons_expert_grid_for_moe_at_world_4():
    """The expert GTP group pairs ranks that hold the same experts (EP rank equal), as Megatron forms it."""
    from megatron.core import parallel_state as ps
    gen = ps.RankGenerator(tp=1, ep=2, dp=1, pp=1, cp=1, order=ps._inject_gtp_remat_axis("tp-cp-ep-dp-pp", after="ep"),
                           gtp_remat=2)
    assert gen.get_ranks("gtp_remat") == [[0, 2], [1, 3]]
    assert gen.get_ranks("ep") == [[0, 1], [2, 3]]


def test_resolve_names_skips_and_refuses():
    assert hp.resolve("gpt,tp2,ckpt", 2) == (["gpt", "ckpt"], {"tp2": "runs at world 4, not 2"})
    with pytest.raises(ValueError, match="--variants nope: choose from"):
        hp.resolve("gpt,nope", 2)


def test_checkpoint_plan_crosses_g_both_ways_and_loads_only_what_was_saved():
    plan = hp.checkpoint_plan()
    saved = set()
    g = {}
    variant = hp.VARIANTS[hp.CKPT_VARIANT]
    for phase in plan:
        if phase["role"] == "save":
            saved.add(phase["ckpt"])
            g[phase["ckpt"]] = hp.layout(variant, phase["world"], phase["impl"])["gtp_remat_size"]
        else:
            assert phase["ckpt"] in saved and set(phase["impls"]) == set(hp.IMPLS)
            assert hp.layout(variant, phase["world"], "libgtp")["gtp_remat_size"] != g[phase["ckpt"]]
    assert g == {"megatron_g4": 4, "libgtp_g2": 2}
    assert [p["impl"] for p in plan if p["role"] == "save"] == ["megatron", "libgtp"]


def test_phase_shares_give_loads_twice_a_save_and_use_all_the_time():
    plan = hp.checkpoint_plan()
    assert [hp.phase_share(plan, 0, 360), hp.phase_share(plan, 1, 300)] == [60, 120]
    assert hp.phase_share(plan, 3, 100) == 100


def test_a_load_phase_runs_only_after_its_save_and_with_time_left():
    save, load = hp.checkpoint_plan()[:2]
    assert hp.phase_blocker(save, set(), 60) is None
    assert hp.phase_blocker(load, set(), 60) == "the checkpoint megatron_g4 was not saved"
    assert hp.phase_blocker(load, {"megatron_g4"}, 60) is None
    assert hp.phase_blocker(save, set(), 5) == "5 s left for it"


# -- h2h_compare --
LOG = """host:1:2 [0] NCCL INFO AllGather: opCount 3 sendbuff 0x1 recvbuff 0x2 count 1024 datatype 9 op 0 root 0 comm 0x5 [nranks=2] stream 0x6
host:1:2 [0] NCCL INFO ReduceScatter: opCount 4 sendbuff 0x1 recvbuff 0x2 count 512 datatype 7 op 4 root 0 comm 0x5 [nranks=2] stream 0x6
host:1:2 [0] NCCL INFO AllReduce: opCount 5 sendbuff 0x1 recvbuff 0x2 count 1 datatype 7 op 0 root 0 comm 0x7 [nranks=1] stream 0x6
host:1:2 [0] NCCL INFO some other line
"""


def test_parse_nccl_reads_op_bytes_and_ranks():
    assert hc.parse_nccl(LOG) == [("AllGather", 2048, 2), ("ReduceScatter", 2048, 2), ("AllReduce", 4, 1)]


def test_op_table_averages_from_the_counted_step_and_gathers_per_weight():
    ops = hc.parse_nccl(LOG)
    steps = [ops * 9, ops * 9, ops, ops * 3]  # the first COUNT_FROM_STEP steps are set-up
    table = hc.op_table(steps)
    assert table["AllGather[nranks=2]"] == {"ops_per_step": 2.0, "bytes_per_step": 4096.0}
    assert table["AllReduce[nranks=1]"]["ops_per_step"] == 2.0
    g = hc.gathers_per_weight(table, (2, 1), weights=2)
    assert g == {"allgathers_per_step": 2.0, "gtp_weights": 2, "allgathers_per_weight_per_step": 1.0}
    assert hc.gathers_per_weight(table, (4,), weights=2)["allgathers_per_step"] == 0
    assert hc.op_table(steps[:2]) == {}


def _run(losses, norms, params):
    return {"losses": losses, "grad_norms": norms, "params": params}


def _params(shift=0.0, start=4):
    full = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    return {"off": {"w": (0, full), "ln": (0, torch.ones(4))},
            "shard": {"w": (start, full[start:start + 4] + shift), "ln": (0, torch.ones(4))}}


def test_verdict_bit_identical_needs_losses_norms_and_every_parameter():
    p = _params()
    lib = _run([2.0, 1.5], [1.0, 0.9], p["shard"])
    off = _run([2.0, 1.5000001], [1.0, 0.9], p["off"])
    v = hc.verdict(lib, dict(lib), off)
    assert v["verdict"] == "bit-identical" and v["params_compared"] == 2
    assert v["max_param_abs_diff_vs_off"]["libgtp"] == 0.0  # rows 4..8 of the full weight
    meg = _run([2.0, 1.5], [1.0, 0.9], _params(shift=2 ** -7)["shard"])
    v = hc.verdict(lib, meg, off)
    assert v["verdict"] != "bit-identical" and v["max_param_abs_diff_libgtp_megatron"] == 2 ** -7


def test_verdict_within_and_beyond_megatrons_bound_with_the_bound_written():
    p = _params()
    off = _run([2.0, 1.0], [1.0, 1.0], p["off"])
    lib = _run([2.0, 1.0 + 1e-5], [1.0, 1.0], p["shard"])
    meg = _run([2.0, 1.0 - 2e-5], [1.0, 1.0], p["shard"])
    v = hc.verdict(lib, meg, off)
    assert v["verdict"] == "within Megatron's bound"
    assert v["steps"] == ["bit-identical", "within Megatron's bound"]
    assert v["bound"]["libgtp"] == pytest.approx(1e-5) and v["bound"]["megatron_bound"] == pytest.approx(2e-5)
    v = hc.verdict(meg, lib, off)
    assert v["verdict"] == "beyond Megatron's bound" and v["steps"][1] == "beyond Megatron's bound"


def test_verdict_on_a_stage_without_losses_uses_the_parameters():
    p, q = _params(), _params(shift=1e-3)
    off = _run([], [1.0], p["off"])
    v = hc.verdict(_run([], [1.0], p["shard"]), _run([], [1.0], q["shard"]), off)
    assert v["verdict"] == "within Megatron's bound" and v["bound"]["measure"] == "max param abs diff vs off"
    v = hc.verdict(_run([], [1.0], q["shard"]), _run([], [1.0], p["shard"]), off)
    assert v["verdict"] == "beyond Megatron's bound"


def test_verdict_refusals_and_failures():
    p = _params()
    off = _run([2.0], [1.0], p["off"])
    ok = _run([2.0], [1.0], p["shard"])
    assert hc.verdict({"error": "RuntimeError: no", "refused": True}, ok, off)["verdict"] == \
        "refused by libgtp: RuntimeError: no"
    v = hc.verdict(ok, {"error": "build: AssertionError: x"}, off)
    assert v["verdict"].startswith("failed: megatron (libgtp ran)") and v["max_rel_loss_vs_off"]["libgtp"] == 0.0
    assert hc.verdict(ok, ok, {"error": "boom"})["verdict"] == "failed: off: boom"
    with pytest.raises(ValueError, match="stopped at different steps"):
        hc.verdict(ok, ok, _run([2.0, 1.0], [1.0, 1.0], p["off"]))


def test_overall_is_the_worst_rank():
    v = lambda t: {"verdict": t}  # noqa: E731
    assert hc.overall([v("bit-identical"), v("within Megatron's bound")]) == "within Megatron's bound"
    assert hc.overall([v("beyond Megatron's bound"), v("refused by libgtp: x")]) == "refused by libgtp: x"
    assert hc.overall([v("refused by libgtp: x"), v("failed: y")]) == "failed: y"
    assert hc.overall([]).startswith("failed")


def test_rows_diff_compares_only_shared_rows():
    a = torch.zeros(4, 2)
    b = torch.ones(2, 2)
    assert hc.rows_diff(0, a, 3, b) == (1.0, 1)
    assert hc.rows_diff(0, a, 4, b) == (None, 0)
    assert hc.rows_diff(0, a, 0, torch.ones(2, 3)) == (None, 0)


def test_loaded_equal_flags_a_load_that_differs():
    p = _params()
    out = hc.loaded_equal({"off": p["off"], "libgtp": p["shard"], "megatron": _params(shift=1.0)["shard"]})
    assert out["libgtp"]["equal_to_off"] and not out["megatron"]["equal_to_off"]


# -- the command line (no GPU needed for what it refuses or skips) --
def _cli(*args, tmp_path):
    out = tmp_path / "h2h.json"
    env = {**os.environ, "PYTHONPATH": os.path.join(HERE, "..", "..", "bindings", "python")}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "head_to_head.py"), "--json", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc, out


def test_cli_refuses_unknown_variants_and_too_few_steps(tmp_path):
    proc, _ = _cli("--variants", "gpt,nope", tmp_path=tmp_path)
    assert proc.returncode == 2 and "--variants nope: choose from" in proc.stderr
    proc, _ = _cli("--steps", "2", tmp_path=tmp_path)
    assert proc.returncode == 2 and "--steps 2" in proc.stderr


def test_cli_skips_a_variant_of_another_world_and_writes_the_json(tmp_path):
    proc, out = _cli("--world", "2", "--variants", "tp2,pp2vpp", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["variants"] == {} and set(report["skipped"]) == {"tp2", "pp2vpp"}
    assert "h2h tp2: skipped, runs at world 4, not 2" in proc.stdout


# -- h2h_ranks' assembly of a rank's result, with run_impl replaced by a test double (the real one needs a GPU) --
def _fake_run(losses, shift=0.0, ops_per_step=2):
    p = _params(shift=shift)
    ops = [[("AllGather", 64, 2)] * ops_per_step] * 4
    return {"losses": losses, "loss_hex": [x.hex() for x in losses], "grad_norms": [1.0] * len(losses),
            "ops": ops, "params": p["shard"], "initial": p["shard"], "checks": {}, "gtp_weights": 2, "seconds": 1.0}


def test_variant_rank_writes_partials_and_a_json_summary(monkeypatch, tmp_path):
    import h2h_ranks
    runs = {"off": _fake_run([2.0, 1.5, 1.2, 1.0]) | {"params": _params()["off"], "ops": [[]] * 4},
            "megatron": _fake_run([2.0, 1.5, 1.2, 1.0]), "libgtp": _fake_run([2.0, 1.5, 1.2, 1.0], ops_per_step=4)}
    seen = []

    def fake_run_impl(variant, world, impl, steps, reference):
        seen.append((impl, reference is not None))
        return runs[impl]
    monkeypatch.setattr(h2h_ranks, "run_impl", fake_run_impl)
    partial = str(tmp_path / "partial.json")
    summary = h2h_ranks.variant_rank(0, 2, "gpt", 4, partial)
    assert seen == [("off", False), ("megatron", True), ("libgtp", True)]
    assert summary["verdict"] == "bit-identical"
    assert summary["gathers"]["libgtp"]["allgathers_per_weight_per_step"] == 2.0
    assert summary["gathers"]["libgtp_over_megatron"] == 2.0
    json.dumps(summary)  # no tensors reach the JSON
    assert set(json.loads((tmp_path / "partial.json").read_text())["runs"]) == {"off", "megatron", "libgtp"}


def test_variant_rank_stops_after_a_failure_in_training(monkeypatch, tmp_path):
    import h2h_ranks
    calls = []

    def fake_run_impl(variant, world, impl, steps, reference):
        calls.append(impl)
        if impl == "megatron":
            return {"error": "training: RuntimeError: NCCL", "in_training": True}
        return _fake_run([2.0, 1.0]) | ({"params": _params()["off"]} if impl == "off" else {})
    monkeypatch.setattr(h2h_ranks, "run_impl", fake_run_impl)
    summary = h2h_ranks.variant_rank(1, 2, "gpt", 4, str(tmp_path / "p.json"))
    assert calls == ["off", "megatron"]
    assert summary["verdict"] == ("failed: libgtp: not run: megatron failed during training "
                                  "(training: RuntimeError: NCCL)")
    json.dumps(summary)

"""gtp.bridge with the real Megatron Bridge 0.6.2 and Megatron-Core 0.19.2 on CPU (gloo ranks, libgtp's
host backend): knobs through Bridge's runtime_config_update / ConfigContainer.validate, the refusals,
process groups through Bridge's own _initialize_distributed at TP 2 x G 2 and DP 2 x G 2, the DP x G
data view (sampler indices, consumed samples, eval counts), unique checkpoint replica ids. Bridge needs
Python >= 3.12: skips, saying why, elsewhere or without the packages (tools/setup.sh makes .venv312)."""
import importlib.util
import os
import sys

import pytest

if sys.version_info < (3, 12):
    pytest.skip(f"Megatron Bridge 0.6.2 needs Python >= 3.12, this is {sys.version.split()[0]} (tools/setup.sh "
                "builds .venv312 where pyenv has 3.12; bazel's bridge_test runs it)", allow_module_level=True)
for _name in ("torch", "megatron.core", "megatron.bridge", "nvidia_resiliency_ext"):
    if importlib.util.find_spec(_name.split(".")[0]) is None or importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed (tools/setup.sh installs tools/constraints-bridge.txt into .venv312)",
                    allow_module_level=True)

import torch  # noqa: E402
from ranks import run_ranks  # noqa: E402


def _bridge():
    """Bridge imported as a user would after gtp.bridge.apply_install_workarounds (with the TE import
    double where TransformerEngine is absent, see bridge_te_double.py)."""
    from gtp.bridge import install
    install.hide_old_nvrx_async()
    from bridge_te_double import import_bridge
    import_bridge()
    install.apply_install_workarounds()
    import gtp.bridge as gb
    return gb


def _cfg(world, **kwargs):
    from gtp.bridge.recipe import tiny_gpt_config
    from megatron.bridge.training.config import runtime_config_update
    os.environ["WORLD_SIZE"] = str(world)
    cfg = tiny_gpt_config(**kwargs)
    cfg.dist.distributed_backend = "gloo"
    runtime_config_update(cfg)  # Bridge's own: mixed precision, DP size, ConfigContainer.validate
    return cfg


@pytest.fixture(scope="module")
def gb():
    return _bridge()


def test_knobs_derive_as_megatron_core_through_bridge_validate(gb):
    for world, tp, shards, g in ((4, 1, 2, 2), (4, 2, 4, 2), (8, 2, 8, 4), (4, 1, None, 1), (4, 2, 2, 1)):
        cfg = _cfg(world, tp=tp, num_weight_shards=shards, global_batch_size=16, micro_batch_size=2)
        s = gb.check(cfg, world)
        assert cfg.model.gtp_weight_remat_size == g == s.gtp  # Megatron-Core's finalize, run by validate
        assert cfg.data_parallel_size == world // tp == s.data_ranks  # Bridge's DP is DP x G
        assert s.dp == world // (tp * g)
    with pytest.raises(ValueError, match="tensor_parallel_num_weight_shards \\(3\\) must be"):
        _cfg(4, tp=2, num_weight_shards=3)  # Megatron-Core's refusal, raised inside Bridge's validate
    with pytest.raises(ValueError, match="tensor_parallel_num_weight_shards \\(1\\) must be >="):
        _cfg(4, tp=2, num_weight_shards=1)
    cfg = _cfg(6, tp=1, num_weight_shards=4, global_batch_size=12, micro_batch_size=1)  # Bridge accepts 6 / 1
    with pytest.raises(ValueError, match="world_size \\(6\\) is not divisible .* gtp_weight_remat_size \\(4\\)"):
        gb.check(cfg, 6)
    with pytest.raises(ValueError, match="world_size \\(6\\) is not divisible"):
        gb.enable(cfg)
    assert gb.enabled() is None


def test_every_refusal_names_the_fix(gb):
    from megatron.bridge.training.config import InProcessRestartConfig
    cases = [
        (lambda c: setattr(c.dist, "use_decentralized_pg", True), "use_decentralized_pg=False"),
        (lambda c: setattr(c, "inprocess_restart", InProcessRestartConfig(enabled=True)), "inprocess_restart=None"),
        (lambda c: setattr(c.ddp, "average_in_collective", True), "average_in_collective=False"),
        (lambda c: setattr(c.checkpoint, "ckpt_format", "torch"), "ckpt_format='torch_dist'"),
        (lambda c: setattr(c.checkpoint, "async_save", True), "async_save=False"),
        (lambda c: setattr(c.dist, "use_torch_fsdp2", True), "use DDP"),
        (lambda c: setattr(c.dist, "use_tp_pp_dp_mapping", True), "use_tp_pp_dp_mapping=False"),
        (lambda c: setattr(c.dist, "use_gloo_process_groups", True), "use_gloo_process_groups=False"),
        (lambda c: setattr(c.model, "cuda_graph_impl", "local"), "cuda_graph_impl='none'"),
        (lambda c: setattr(c.model, "delay_wgrad_compute", True), "delay_wgrad_compute=False"),
        (lambda c: setattr(c.model, "calculate_per_token_loss", True), "calculate_per_token_loss=False"),
        (lambda c: (setattr(c.model, "fp8", "e4m3"), setattr(c.model, "fp8_recipe", "delayed")), "tensorwise"),
    ]
    for change, fix in cases:
        cfg = _cfg(4, num_weight_shards=2, global_batch_size=16)
        gb.check(cfg, 4)  # the unchanged config passes
        change(cfg)
        with pytest.raises(RuntimeError, match=fix):
            gb.check(cfg, 4)
    cfg = _cfg(4, num_weight_shards=None, global_batch_size=16)
    cfg.ddp.average_in_collective = True
    gb.check(cfg, 4)  # at G = 1 Megatron-Core allows it


def test_wrapped_functions_are_checked_and_restored(gb):
    import megatron.bridge.training.initialize as init
    import megatron.bridge.training.pretrain as pre
    originals = (init._initialize_distributed, pre.train, init.destroy_global_state)
    cfg = _cfg(1, num_weight_shards=None)
    gb.enable(cfg)
    assert init._initialize_distributed._gtp_original is originals[0] and pre.train._gtp_original is originals[1]
    assert any(getattr(h, "_gtp_bridge_hook", False) for h in cfg.model._post_wrap_hooks)
    gb.enable(cfg)  # again: one hook, wrappers not stacked
    assert init._initialize_distributed._gtp_original is originals[0]
    assert sum(getattr(h, "_gtp_bridge_hook", False) for h in cfg.model._post_wrap_hooks) == 1
    gb.disable()
    assert (init._initialize_distributed, pre.train, init.destroy_global_state) == originals
    from gtp.bridge import hooks
    saved = pre.train
    try:
        def train(forward_step_func, model):  # a Bridge whose train takes other parameters
            pass
        pre.train = train
        with pytest.raises(RuntimeError, match="pretrain.train.* differs from megatron-bridge 0.6.2"):
            hooks.check_signatures()
    finally:
        pre.train = saved
    hooks.check_signatures()


def test_setup_data_iterators_wrapper_passes_the_data_group(gb):
    """The wrapper's own logic (Bridge's setup_data_iterators stood in by a recorder): at G > 1 the
    loaders get the DP x G group, at G = 1 the group Bridge passed."""
    from types import SimpleNamespace
    from gtp.bridge.hooks import Hooks
    import megatron.core.parallel_state as ps
    seen = []

    def recorder(cfg, train_state, model_length, train_valid_test_datasets_provider, dp_group, *, eval_dp_group=None):
        seen.append(dp_group)
    state = SimpleNamespace(sizes=SimpleNamespace(gtp=2, expert_gtp=1))
    saved = ps.get_data_parallel_group
    ps.get_data_parallel_group = lambda **kw: ("data group", kw)
    try:
        Hooks(state)._setup_data_iterators(recorder)(None, None, 1, None, "replicate")
        state.sizes = SimpleNamespace(gtp=1, expert_gtp=1)
        Hooks(state)._setup_data_iterators(recorder)(None, None, 1, None, "replicate")
    finally:
        ps.get_data_parallel_group = saved
    assert seen == [("data group", {"with_gtp_remat": True}), "replicate"]


def _topology(rank, world, store_dir, tp, shards):
    gb = _bridge()
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(os.path.join(store_dir, "s"), world),
                                         rank=rank, world_size=world)
    gbs, mbs = 16, 2
    cfg = _cfg(world, tp=tp, num_weight_shards=shards, global_batch_size=gbs, micro_batch_size=mbs)
    cfg.validation.eval_iters = 1
    state = gb.enable(cfg, backend="host")
    import megatron.bridge.training.initialize as init
    import megatron.core.parallel_state as ps
    from megatron.core.num_microbatches_calculator import get_num_microbatches, init_num_microbatches_calculator
    from megatron.bridge.data.samplers import MegatronPretrainingSampler
    import gtp.megatron as gm
    init_num_microbatches_calculator(rank, None, gbs, mbs, cfg.data_parallel_size, False)  # as initialize_megatron
    pgc = init._initialize_distributed(model_config=cfg.model, dist_config=cfg.dist, num_distributed_optimizer_instances=1,
                                       get_embedding_ranks=None, get_position_embedding_ranks=None)
    view = gb.data_view(pgc, state.sizes)
    libgtp = gm.active().context.sizes
    out = {"tp": pgc.tp.size(), "g": pgc.gtp_remat.size(), "dp": pgc.dp.size(), "data": view.dp.size(),
           "data_cp": view.dp_cp.size(), "libgtp": (libgtp.tp, libgtp.gtp_remat, libgtp.dp),
           "gtp_ranks": torch.distributed.get_process_group_ranks(pgc.gtp_remat)}
    # Bridge's sampler over the view's group (what the wrapped setup_data_iterators hands it): 3 steps.
    sampler = MegatronPretrainingSampler(total_samples=10_000, consumed_samples=0, micro_batch_size=mbs,
                                         data_parallel_rank=view.dp.rank(), data_parallel_size=view.dp.size())
    batches, it = [], iter(sampler)
    per_step = get_num_microbatches()
    for _ in range(3 * per_step):
        batches.append(next(it))
    out["steps"] = [sum(batches[s * per_step:(s + 1) * per_step], []) for s in range(3)]
    tp_rank_zero = pgc.tp.rank() == 0
    out["reads"] = tp_rank_zero
    # Bridge's own formulas (train.py: consumed samples / FLOPs batch; eval.py: eval microbatches).
    out["consumed_per_step"] = view.dp.size() * mbs * get_num_microbatches()
    eval_gbs = cfg.validation.eval_global_batch_size or gbs
    eval_mbs = cfg.validation.eval_micro_batch_size or mbs
    out["eval_microbatches"] = eval_gbs // (eval_mbs * view.dp.size())
    out["eval_expected"] = eval_gbs // (eval_mbs * view.dp.size())
    out["eval_gbs"], out["eval_mbs"] = eval_gbs, eval_mbs
    # Checkpoint RNG state (Bridge's get_rng_state) with the view the wrapped get_pg_collection returns.
    from megatron.bridge.training import checkpointing
    torch.cuda.get_rng_state = lambda *a, **k: torch.zeros(8, dtype=torch.uint8)  # TEST DOUBLE: no GPU here
    rng_view = checkpointing.get_rng_state(data_parallel_random_init=False, ckpt_format="torch_dist", pg_collection=view)
    rng_plain = checkpointing.get_rng_state(data_parallel_random_init=False, ckpt_format="torch_dist", pg_collection=pgc)
    out["rng"] = (tuple(rng_view.global_offset), rng_view.replica_id, rng_plain.replica_id)
    out["wrapped_view_dp"] = checkpointing.get_pg_collection.__wrapped__ is not None
    import megatron.bridge.training.initialize as init2
    init2.destroy_global_state()
    out["reset"] = gm.active() is None
    gb.disable()
    return out


@pytest.mark.parametrize("tp,world,shards", [(2, 4, 4), (1, 4, 2)], ids=["tp2_g2", "dp2_g2"])
def test_process_groups_data_and_replica_ids_at_g2(tp, world, shards):
    results = run_ranks(_topology, world, tp, shards, timeout_s=420)
    g, dp = 2, world // (tp * 2)
    for r in results:
        assert (r["tp"], r["g"], r["dp"]) == (tp, g, dp)  # Megatron-Core's groups got G from gtp.bridge
        assert r["data"] == r["data_cp"] == dp * g
        assert r["libgtp"] == (tp, g, dp)
        assert r["consumed_per_step"] == 16  # = global batch, not 16 / G
        assert r["eval_microbatches"] * r["eval_mbs"] * dp * g == r["eval_gbs"]
        assert r["reset"]
    assert results[0]["gtp_ranks"] == ([0, 2] if tp == 2 else [0, 1])
    # Each step: data ranks (one per TP group) read distinct samples whose union is the global batch.
    readers = [r for r in results if r["reads"]]
    assert len(readers) == dp * g
    for step in range(3):
        samples = [i for r in readers for i in r["steps"][step]]
        assert sorted(samples) == list(range(16 * step, 16 * (step + 1)))
    # RNG ShardedObject: ranks with the same (pp, tp) offset hold distinct replica ids with the view;
    # Bridge's replicate dp_cp would give the G peers the same id (the collision this fixes).
    by_offset = {}
    for r in results:
        by_offset.setdefault(r["rng"][0], []).append(r["rng"])
    for entries in by_offset.values():
        assert len({e[1] for e in entries}) == len(entries)
        assert len({e[2] for e in entries}) < len(entries)

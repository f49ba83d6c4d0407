"""gtp.megatron over the host backend with the real Megatron-Core 0.19.2 (no TE, no GPU): the routing
of gtp_api, parallel state to libgtp groups, Megatron's own GTP layers (ColumnParallelLinear,
VocabParallelEmbedding at G = 2) driving libgtp, the size and data accounting against Megatron's own
functions, checkpoint re-shard, and the refusals. Skips, saying why, without megatron-core."""
import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed (tools/setup.sh installs megatron-core 0.19.2)", allow_module_level=True)

from types import SimpleNamespace  # noqa: E402

import gtp.megatron as gm  # noqa: E402
from counting_library import count_library_calls  # noqa: E402
from megatron_cpu_doubles import init_megatron  # noqa: E402
from ranks import rank_threads, run_ranks  # noqa: E402

IN, OUT, VOCAB = 32, 64, 96


def _init(rank, world, store_dir, gtp=1, tp=1):
    return init_megatron(rank, world, store_dir, tensor_model_parallel_size=tp, gtp_remat_size=gtp)


def _config():
    from megatron.core.model_parallel_config import ModelParallelConfig
    # BF16 weights: libgtp's bf16 wire materializes BF16, as Megatron's mixed-precision layers use them.
    return ModelParallelConfig(use_cpu_initialization=True, params_dtype=torch.bfloat16, perform_initialization=True)


def _routing(rank, world, store_dir):
    _init(rank, world, store_dir)
    import megatron.core.tensor_parallel.gtp_api as api
    import megatron.core.transformer.cuda_graphs as graphs
    originals = {name: getattr(api, name) for name in gm.API_NAMES}
    graph_originals = {name: getattr(graphs, name, None) for name in ("get_ag_stream", "wait_async_comms")}
    seen = []
    for _ in range(2):  # reset lets the process start again
        ctx = gm.use_libgtp(backend="host", machinery_at_g1=True)  # G = 1: the refusal below is the machinery's
        routed = {name: getattr(api, name) is not originals[name] for name in gm.API_NAMES if name != "GTPChain"}
        graph_routed = getattr(graphs, "wait_async_comms") is api.wait_async_comms
        with pytest.raises(RuntimeError, match="already called"):
            gm.use_libgtp(backend="host", machinery_at_g1=True)
        with pytest.raises(RuntimeError, match="CUDA-graph"):
            api.get_ag_stream()
        with pytest.raises(RuntimeError, match="CUDA-graph"):
            api.classify_gtp_remat_chains([], cuda_graph_impl="local")
        from types import SimpleNamespace as NS
        for recipe in ("delayed", "mxfp8", "blockwise"):  # Megatron's default FP8 recipe is delayed scaling
            with pytest.raises(RuntimeError, match="fp8_recipe='tensorwise'"):
                gm.check_training(NS(fp8="e4m3", fp8_recipe=recipe))
            with pytest.raises(RuntimeError, match="fp8_recipe='tensorwise'"):
                api.configure_gtp_remat_from_recipe(fp8="e4m3", fp8_recipe=recipe)
        gm.check_training(NS(fp8="e4m3", fp8_recipe="tensorwise"))
        api.configure_gtp_remat_from_recipe(fp8="e4m3", fp8_recipe="tensorwise")
        # A TE layer built with use_cpu_initialization would be re-initialized into libgtp's shard
        # after the build: refused when the layer is built (the module here is a stand-in holding a config).
        from types import SimpleNamespace
        with pytest.raises(RuntimeError, match="use_cpu_initialization=False"):
            with gm.active()._te_init_context(SimpleNamespace(config=SimpleNamespace(use_cpu_initialization=True)),
                                              64, None, {}):
                pass
        repacked = _optimizer_step_repacks(ctx)
        seen.append((routed, api.HAVE_GTP, graph_routed, ctx.sizes.gtp_remat, repacked))
        gm.reset()
    restored = all(getattr(api, name) is originals[name] for name in gm.API_NAMES)
    graphs_restored = all(getattr(graphs, n, None) is v for n, v in graph_originals.items())
    return seen, restored, graphs_restored, api.HAVE_GTP


def _optimizer_step_repacks(ctx):
    """Megatron-Core's own FP32Optimizer.step() on a libgtp weight whose storage was replaced (as DDP's
    buffer does): after the step libgtp gathers the updated values. The optimizer is built without its
    constructor, which only puts a loss-scale tensor on CUDA."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from gtp.torch import te as gtp_te
    weight = torch.nn.Parameter(torch.randn(OUT, IN, generator=torch.Generator().manual_seed(3)))
    param = gtp_te._shard_of(weight, ctx, "optimizer_test.weight", "bf16", "gtp_remat", None, {}, gm.MegatronParameter)
    gm.active()._tag([param])
    ctx.shard_updated([param])
    param.data = torch.empty(8 + param.numel())[8:].view_as(param).copy_(param.detach())  # DDP's buffer view
    param.main_grad = torch.ones_like(param)
    expected = (param.detach() - 0.5).bfloat16()  # SGD's update of every value by -lr x 1
    optimizer = FP32Optimizer.__new__(FP32Optimizer)
    optimizer.optimizer = torch.optim.SGD([param], lr=0.5)
    optimizer.config = OptimizerConfig(clip_grad=0.0)
    optimizer.is_stub_optimizer = False
    ok, _, _ = optimizer.step()
    full = param.materialize_group_for_forward()
    param.release_group()
    return ok and torch.equal(full, expected)


def test_use_libgtp_routes_every_gtp_api_function_and_reset_restores_them(tmp_path):
    """Every gtp_api name (and cuda_graphs' copies) is libgtp's after use_libgtp and Megatron-Core's
    again after reset, twice in one process; a Megatron-Core optimizer step re-packs libgtp's shards."""
    seen, restored, graphs_restored, have_gtp = run_ranks(_routing, 1)[0]
    for routed, have, graph_routed, g, repacked in seen:
        assert all(routed.values()), [k for k, v in routed.items() if not v]
        assert have is True and graph_routed and g == 1
        assert repacked, "after Megatron's optimizer step libgtp gathered stale values"
    assert restored and graphs_restored
    assert have_gtp is False  # Megatron-Core's own answer without TE, back after reset


def _layers(rank, world, store_dir, gtp, sum_grads=False):
    ps = _init(rank, world, store_dir, gtp=gtp)
    ctx = gm.use_libgtp(backend="host", sum_grads=sum_grads)
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
    config = _config()
    torch.manual_seed(7)
    linear = ColumnParallelLinear(IN, OUT, config=config, init_method=torch.nn.init.normal_, bias=False,
                                  gather_output=False)
    embedding = VocabParallelEmbedding(VOCAB, IN, init_method=torch.nn.init.normal_, config=config)
    data = torch.Generator().manual_seed(100 + ctx.sizes.data_parallel_index)
    tokens = torch.randint(0, VOCAB, (5, 3), generator=data)
    hidden = embedding(tokens)
    out, _ = linear(hidden)
    out.square().sum().backward()
    import megatron.core.tensor_parallel.gtp_api as api
    api.classify_gtp_remat_chains([embedding, linear])  # two "chunks": each weight names its own
    result = {"chunks": (embedding.weight.model_chunk, linear.weight.model_chunk), "kind": (type(linear.weight).__name__, type(embedding.weight).__name__),
              "linear_rows": (linear.weight.geometry.row_start, linear.weight.geometry.valid_rows),
              "embed_rows": (embedding.weight.geometry.row_start, embedding.weight.geometry.valid_rows),
              "linear": linear.weight.detach().clone(), "embed": embedding.weight.detach().clone(),
              "linear_grad": linear.weight.grad, "embed_grad": embedding.weight.grad, "tokens": tokens,
              "out": out.detach(), "group_ranks": torch.distributed.get_process_group_ranks(
                  ps.get_gtp_weight_remat_group())}
    from types import SimpleNamespace as NS
    refusals = []
    for per_token in (not sum_grads, sum_grads):  # the mismatch is refused naming the fix; the match passes
        try:
            gm.check_training(NS(calculate_per_token_loss=per_token))
        except RuntimeError as e:
            refusals.append(str(e).split("use_libgtp(")[-1].rstrip(")"))
    result["refusals"] = refusals
    gm.reset()
    return result


def test_megatron_column_parallel_linear_and_embedding_at_g2_on_libgtp_match_the_unsharded_layers():
    """Megatron-Core's own layers call wrap_module_params_gtp, all_gather_and_prefetch, GTPEmbeddingWeight
    and wgrad_reduce_scatter at G = 2: served by libgtp, outputs and the mean gradient equal the
    unsharded computation on each rank's data."""
    results = run_ranks(_layers, 2, 2)
    assert all(r["kind"] == ("MegatronParameter", "MegatronParameter") for r in results)
    assert results[0]["group_ranks"] == [0, 1]
    assert all(r["chunks"] == (0, 1) for r in results)
    linear = torch.cat([r["linear"] for r in results])
    embed = torch.cat([r["embed"] for r in results])
    assert linear.shape == (OUT, IN) and embed.shape == (VOCAB, IN)
    grads_l, grads_e = [], []
    with rank_threads():
        references = [_reference(r, linear, embed) for r in results]
    for r, (out, g_l, g_e) in zip(results, references):
        torch.testing.assert_close(r["out"], out, rtol=0, atol=0)
        grads_l.append(g_l.float())
        grads_e.append(g_e.float())
    mean_l, mean_e = ((grads_l[0] + grads_l[1]) / 2).bfloat16(), ((grads_e[0] + grads_e[1]) / 2).bfloat16()
    # per-token loss on this averaging context: refused, naming use_libgtp(sum_grads=True); off: passes
    assert all(r["refusals"] == ["sum_grads=True"] for r in results), results[0]["refusals"]
    for r in results:
        s, n = r["linear_rows"]
        torch.testing.assert_close(r["linear_grad"], mean_l[s:s + n], rtol=0, atol=0)
        s, n = r["embed_rows"]
        torch.testing.assert_close(r["embed_grad"], mean_e[s:s + n], rtol=0, atol=0)


def test_per_token_loss_at_g2_sums_the_gtp_axis_as_megatron_does():
    """calculate_per_token_loss: Megatron's GTP reduce-scatters the SUM over G (no 1/G pre-scale).
    use_libgtp(sum_grads=True) does the same: each shard's gradient is the sum of the ranks' unsharded
    gradients, bit for bit (FP32 sums of two); check_training refuses a config whose per-token setting
    differs from the context's, naming the fix."""
    results = run_ranks(_layers, 2, 2, True)
    linear = torch.cat([r["linear"] for r in results])
    embed = torch.cat([r["embed"] for r in results])
    with rank_threads():
        references = [_reference(r, linear, embed) for r in results]
    sum_l = (references[0][1].float() + references[1][1].float()).bfloat16()
    sum_e = (references[0][2].float() + references[1][2].float()).bfloat16()
    for r in results:
        s, n = r["linear_rows"]
        torch.testing.assert_close(r["linear_grad"], sum_l[s:s + n], rtol=0, atol=0)
        s, n = r["embed_rows"]
        torch.testing.assert_close(r["embed_grad"], sum_e[s:s + n], rtol=0, atol=0)
    # per-token loss off on a summing context: refused, naming use_libgtp(sum_grads=False); on: passes
    assert all(r["refusals"] == ["sum_grads=False"] for r in results), results[0]["refusals"]


def _reference(r, linear, embed):
    """The unsharded layers on one rank's data, in the same ops and dtype as Megatron's path."""
    w_l = linear.clone().requires_grad_()
    w_e = embed.clone().requires_grad_()
    out = torch.matmul(torch.nn.functional.embedding(r["tokens"], w_e), w_l.t())
    out.square().sum().backward()
    return out.detach(), w_l.grad, w_e.grad


def _g1(rank, world, store_dir, libgtp):
    """Megatron-Core's own layers at G = 1 trained one step, without gtp.megatron or after use_libgtp()
    (its default: inert in a group of one, as Megatron's GTP at size 1), libgtp's calls counted; then
    the two GTP entry points Megatron-Core's layers have (TE's _init_gtp_remat_context, entered by every
    TE layer's constructor; wrap_module_params_gtp, called by its own layers at G > 1) on the size-1
    group, Megatron-Core's own and the routed ones, as the layers call them."""
    ps = _init(rank, world, store_dir)
    import megatron.core.extensions.transformer_engine as te_ext  # imports without TE; its GTP hook runs on CPU
    from megatron.core.tensor_parallel import generalized_tensor_parallelism as mgtp
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    entry_points = {"megatron": (te_ext._init_gtp_remat_context, mgtp.wrap_module_params_gtp)}
    calls = None
    if libgtp:
        calls = count_library_calls(gm.use_libgtp(backend="host"))
        import megatron.core.tensor_parallel.gtp_api as api
        entry_points["libgtp"] = (te_ext._init_gtp_remat_context, api.wrap_module_params_gtp)
        assert entry_points["libgtp"] != entry_points["megatron"]
    config = _config()
    torch.manual_seed(7)
    embedding = VocabParallelEmbedding(VOCAB, IN, init_method=torch.nn.init.normal_, config=config)
    column = ColumnParallelLinear(IN, OUT, config=config, init_method=torch.nn.init.normal_, bias=True,
                                  gather_output=False)
    row = RowParallelLinear(OUT, IN, config=config, init_method=torch.nn.init.normal_, bias=False,
                            input_is_parallel=True, skip_bias_add=False)
    tokens = torch.randint(0, VOCAB, (5, 3), generator=torch.Generator().manual_seed(100))
    hidden, _ = column(embedding(tokens))
    out, _ = row(torch.nn.functional.gelu(hidden))
    out.float().square().sum().backward()
    layers = (embedding, column, row)
    result = {"out": out.detach(), "params": [(type(p).__name__, p.detach().clone(), p.grad) for m in layers
                                              for p in m.parameters()], "entry_points": {}}
    # A TE layer's constructor, as TELinear enters it: a config the machinery refuses (CPU init) passes.
    te_layer = torch.nn.Linear(IN, OUT)
    te_layer.config = SimpleNamespace(use_cpu_initialization=True)
    for side, (init_context, wrap) in entry_points.items():
        with init_context(te_layer, OUT, ps.get_gtp_weight_remat_group(), {}, is_expert=False) as size:
            pass
        wrap(column, ["weight"], ps.get_gtp_weight_remat_group())
        result["entry_points"][side] = (size, type(te_layer.weight).__name__, type(column.weight).__name__)
    if libgtp:
        result["calls"] = dict(calls.calls)
        result["libgtp_params"] = len(gm.active().params)
        gm.reset()
    return result


def test_at_g1_use_libgtp_is_inert_as_megatron_cores_gtp():
    """G = 1 after use_libgtp(): Megatron-Core's layers train bit for bit as without it, no call reaches
    libgtp, and both GTP entry points behave as Megatron-Core's own at size 1 (the TE constructor's
    yields the size and attaches nothing, the layers' wrap leaves the weight a plain parameter)."""
    (without,) = run_ranks(_g1, 1, False)
    (inert,) = run_ranks(_g1, 1, True)
    assert inert["calls"] == {} and inert["libgtp_params"] == 0, inert["calls"]
    assert torch.equal(inert["out"], without["out"])
    assert len(inert["params"]) == len(without["params"]) == 4
    for (kind, value, grad), (kind_off, value_off, grad_off) in zip(inert["params"], without["params"]):
        assert kind == kind_off == "Parameter"
        assert torch.equal(value, value_off) and torch.equal(grad, grad_off)
    expected = (OUT, "Parameter", "Parameter")
    assert inert["entry_points"] == {"megatron": expected, "libgtp": expected}


def _groups(rank, world, store_dir, tp, gtp):
    _init(rank, world, store_dir, gtp=gtp, tp=tp)
    ctx = gm.use_libgtp(backend="host")  # check=True: all_gather of positions against Megatron's groups
    sizes = ctx.sizes
    gm.reset()
    return sizes


def test_libgtp_groups_hold_the_ranks_of_megatrons_groups_tp2_g2():
    results = run_ranks(_groups, 4, 2, 2)
    assert [(s.tp_rank, s.gtp_remat_rank) for s in results] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert all(s.tp == 2 and s.gtp_remat == 2 and s.dp == 1 for s in results)


def test_sizes_and_microbatches_follow_megatron_core():
    from megatron.core.model_parallel_config import resolve_tensor_parallel_weight_shards
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    for tp in (1, 2, 4):
        for shards in (None, 1, 2, 3, 4, 6, 8, 16):
            try:
                expected = resolve_tensor_parallel_weight_shards(tp, shards, 1)[1]
            except ValueError:
                expected = None
            if expected is None:
                with pytest.raises(ValueError, match="tensor_parallel_num_weight_shards"):
                    gm.weight_shards_to_gtp(tp, shards)
            else:
                assert gm.weight_shards_to_gtp(tp, shards) == expected
    sizes = gm.derive_sizes(16, tp=2, num_weight_shards=4)
    assert (sizes.gtp, sizes.dp, sizes.data_ranks) == (2, 4, 8)
    with pytest.raises(ValueError, match="world_size \\(12\\) is not divisible .* = 8"):
        gm.derive_sizes(12, tp=2, num_weight_shards=8)
    for global_batch in (8, 16, 24, 32, 12):
        for micro in (1, 2, 4):
            try:
                calc = ConstantNumMicroBatchesCalculator(global_batch, micro, sizes.data_ranks, False, 0)
                expected = calc.get()
            except AssertionError:
                expected = None
            if expected is None:
                with pytest.raises(ValueError, match="DP \\(4\\) x G \\(2\\)"):
                    gm.microbatches(global_batch, micro, sizes)
            else:
                assert gm.microbatches(global_batch, micro, sizes) == expected
    assert gm.consumed_samples(3, 32) == 96


def test_training_settings_libgtp_does_not_run_are_refused_with_the_fix():
    from types import SimpleNamespace as NS
    for config, ddp, match in ((NS(cuda_graph_impl="local"), None, "cuda_graph_impl='none'"),
                               (NS(delay_wgrad_compute=True), None, "delay_wgrad_compute=False"),
                               (NS(fp8_param=True), None, "fp8_param_gather"),
                               (NS(), NS(use_megatron_fsdp=True), "Megatron FSDP")):
        with pytest.raises(RuntimeError, match=match):
            gm.check_training(config, ddp)
    gm.check_training(NS(cuda_graph_impl="none"), NS(overlap_param_gather=True))  # test_megatron_param_gather.py


def _sharded(layer):
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
    return layer.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def _ckpt_layer(seed):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    torch.manual_seed(seed)
    return ColumnParallelLinear(IN, OUT, config=_config(), init_method=torch.nn.init.normal_, bias=True,
                                gather_output=False)


def _ckpt_save(rank, world, store_dir, folder, gtp):
    _init(rank, world, store_dir, gtp=gtp)
    gm.use_libgtp(backend="host")
    from megatron.core import dist_checkpointing
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    layer = _ckpt_layer(11)
    dist_checkpointing.save(_sharded(layer), folder)
    result = (layer.weight.geometry.row_start, layer.weight.detach().clone(), layer.bias.detach().clone())
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
    refusals = []
    # A padded split, through the GTP helper (a linear layer) and through Megatron's TP helper, which
    # VocabParallelEmbedding (and a tied output weight) call directly.
    for padded in (ColumnParallelLinear(IN, 48, config=_config(), init_method=torch.nn.init.normal_, bias=False),
                   VocabParallelEmbedding(48, IN, init_method=torch.nn.init.normal_, config=_config())):
        try:
            _sharded(padded)
            refusals.append(None)
        except ValueError as error:
            refusals.append(str(error))
    gm.reset()
    return result + (refusals,)


def _ckpt_load(rank, world, store_dir, folder, gtp, libgtp):
    _init(rank, world, store_dir, gtp=gtp)
    if libgtp:
        gm.use_libgtp(backend="host")
    from megatron.core import dist_checkpointing
    layer = _ckpt_layer(99)  # other values until loaded
    layer.load_state_dict(dist_checkpointing.load(_sharded(layer), folder))
    x = torch.randn(3, 2, IN, generator=torch.Generator().manual_seed(5)).bfloat16()
    out, _ = layer(x)  # libgtp gathers what it re-packed after the load
    result = (getattr(layer.weight, "geometry", None) and layer.weight.geometry.row_start,
              layer.weight.detach().clone(), out.detach(), x)
    gm.reset()
    return result


def test_torch_dist_checkpoint_saved_at_g2_loads_at_another_g_and_padded_splits_are_refused(tmp_path):
    """Megatron's sharded_state_dict of libgtp shards at G = 2 (two processes, real torch_dist files) is
    the GTP-off layout: it loads with GTP off, on libgtp at G = 1 and at G = 4 (each rank its own rows),
    and libgtp's gathered weight after the load is the saved one (forward output). A split libgtp pads
    (48 rows over G = 2) is refused at save, naming the sizes that work, a linear layer's and an
    embedding's alike."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    saved = run_ranks(_ckpt_save, 2, str(folder), 2)
    weight = torch.cat([w for _, w, _, _ in sorted(saved, key=lambda s: s[0])])
    for *_, refusals in saved:
        for refusal in refusals:
            assert refusal is not None and "48 rows over G=2 are padded to 64" in refusal and "multiple of 32" in refusal
    for load_gtp, libgtp in ((1, False), (1, True), (4, True)):
        loaded = run_ranks(_ckpt_load, load_gtp, str(folder), load_gtp, libgtp)
        for start, shard, out, x in loaded:
            start = start or 0
            torch.testing.assert_close(shard, weight[start:start + shard.shape[0]], rtol=0, atol=0)
            with rank_threads():
                expected = torch.matmul(x, weight.t()) + saved[0][2]
            torch.testing.assert_close(out, expected, rtol=0, atol=0)


def _steps_with_megatron_optimizer(rank, world, store_dir, report_steps):
    """Four optimizer steps of two microbatches each through Megatron-Core's embedding and column-parallel
    linear on libgtp at G = 2, stepped by a Megatron-Core optimizer (FP32Optimizer, built without its
    constructor, which only puts a loss-scale tensor on CUDA). Returns libgtp's stale-prefetch count
    after each step: a chain head prefetched at a step's last drain from the shards the optimizer then
    changes is gathered twice."""
    _init(rank, world, store_dir, gtp=2)
    ctx = gm.use_libgtp(backend="host")
    if not report_steps:  # what gtp.megatron did before it told the context about its optimizer steps
        ctx.optimizer_stepped = lambda: None
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
    import megatron.core.tensor_parallel.gtp_api as api
    config = _config()
    torch.manual_seed(7)
    linear = ColumnParallelLinear(IN, OUT, config=config, init_method=torch.nn.init.normal_, bias=False,
                                  gather_output=False)
    embedding = VocabParallelEmbedding(VOCAB, IN, init_method=torch.nn.init.normal_, config=config)
    api.classify_gtp_remat_chains([embedding, linear])
    optimizer = FP32Optimizer.__new__(FP32Optimizer)
    optimizer.optimizer = torch.optim.SGD([embedding.weight, linear.weight], lr=1e-3)
    optimizer.config = OptimizerConfig(clip_grad=0.0)
    optimizer.is_stub_optimizer = False
    data = torch.Generator().manual_seed(100 + rank)
    stale = []
    for _ in range(4):
        for _ in range(2):
            out, _ = linear(embedding(torch.randint(0, VOCAB, (5, 3), generator=data)))
            out.square().sum().backward()
        for p in (embedding.weight, linear.weight):  # what the optimizer reads (the values do not matter here)
            p.main_grad = torch.zeros_like(p)
        ok, _, _ = optimizer.step()
        assert ok
        stale.append(ctx.stats()["materialize"]["stale_prefetches"])
    gm.reset()
    return stale


@pytest.mark.parametrize("report_steps", [True, False], ids=["reported", "not_reported"])
def test_megatron_optimizer_steps_leave_the_next_head_to_the_repack(report_steps):
    """gtp.megatron reports each optimizer step to the context, so from the second step on the last
    drain of a step leaves the next step's head to the re-pack: no stale prefetch is gathered again.
    Without the report (the control) every step re-gathers its head once: the count the test relies on."""
    for stale in run_ranks(_steps_with_megatron_optimizer, 2, report_steps):
        if report_steps:
            assert stale[-1] == stale[0], f"stale prefetches per step {stale}: the head was gathered twice"
        else:
            assert stale[-1] - stale[0] == 3, f"stale prefetches per step {stale}: the control found no re-gather"

"""gtp.megatron.training (libgtp under Megatron-LM's pretrain) with the real megatron-core 0.19.2 wheel's
`megatron.training` on CPU: the wrap and its refusals (Megatron's version, the wrapped function's
signature), Megatron-LM's own parser with --tensor-parallel-num-weight-shards (G, DP, the DP x G
microbatch count, its refusals), the refusals from parsed arguments, and the wrapper's order at G = 2 on
gloo ranks (libgtp attached after the process groups and before the build, Megatron's gtp_api calls
reaching libgtp). `megatron.training` needs Python >= 3.12 (typing.override): skips, saying why,
elsewhere (bazel's megatron_training_test runs it with GTP_PYTHON312). The training itself needs CUDA:
bench/megatron/pretrain_gpu.py."""
import contextlib
import importlib.util
import inspect
import os
import sys

import pytest

if sys.version_info < (3, 12):
    pytest.skip(f"megatron.training (megatron-core 0.19.2) needs Python >= 3.12 (typing.override), this is "
                f"{sys.version.split()[0]} (tools/setup.sh builds .venv312; bazel's megatron_training_test runs it)",
                allow_module_level=True)
for _name in ("torch", "megatron.core", "megatron.training"):
    if importlib.util.find_spec(_name.split(".")[0]) is None or importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed (tools/setup.sh installs megatron-core 0.19.2 into .venv312)",
                    allow_module_level=True)

from ranks import run_ranks  # noqa: E402

MODEL_ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
              "--max-position-embeddings", "32", "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "20",
              "--eval-interval", "10", "--eval-iters", "2", "--mock-data", "--tokenizer-type", "NullTokenizer",
              "--vocab-size", "128"]


def _import_training():
    """megatron.training as a user script imports it; nvidia-resiliency-ext < 0.6.0 (if installed) hidden
    first, as docs/bridge.md's trap 1 (it breaks Megatron-Core's checkpoint import otherwise)."""
    if importlib.util.find_spec("nvidia_resiliency_ext") is not None:
        from gtp.bridge.install import hide_old_nvrx_async
        hide_old_nvrx_async()
    import megatron.training.training as training
    return training


def _parse(world, shards, *extra, global_batch=16):
    """Megatron-LM's own parse_and_validate_args, as a rank of `world` would run it."""
    from megatron.training import arguments, global_vars
    global_vars.unset_global_variables()
    # TEST DOUBLE: validate_args asks the GPU's architecture at G > 1 (for Blackwell stream priorities);
    # there is no GPU here, so it answers Hopper's (9), which takes no branch that changes the sizes.
    arguments.get_device_arch_version = lambda: 9
    os.environ.update(WORLD_SIZE=str(world), RANK="0")
    argv = ["pretrain", *MODEL_ARGS, "--global-batch-size", str(global_batch),
            "--tensor-parallel-num-weight-shards", str(shards), *extra]
    saved, sys.argv = sys.argv, argv
    try:
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            return arguments.parse_and_validate_args()
    finally:
        sys.argv = saved


@pytest.fixture(scope="module")
def training():
    return _import_training()


def test_enable_wraps_setup_and_disable_restores(training):
    import gtp.megatron as gm
    original = training.setup_model_and_optimizer
    wrapper = gm.training.enable()
    try:
        assert training.setup_model_and_optimizer is wrapper and wrapper._gtp_original is original
        assert gm.training.enable() is not wrapper  # enabling again wraps the original, not the wrapper
        assert training.setup_model_and_optimizer._gtp_original is original
        assert gm.training.enabled()
    finally:
        gm.training.disable()
    assert training.setup_model_and_optimizer is original and not gm.training.enabled()
    with pytest.raises(TypeError, match="--calculate-per-token-loss"):
        gm.training.enable(sum_grads=True)


def test_wrong_version_and_signature_are_refused(training, monkeypatch):
    import importlib.metadata
    import gtp.megatron as gm
    original = training.setup_model_and_optimizer
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.18.0" if name == "megatron-core" else real_version(name))
    with pytest.raises(RuntimeError, match="megatron-core 0.19.2; found megatron-core 0.18.0: install megatron-core==0.19.2"):
        gm.training.enable()
    monkeypatch.setattr(importlib.metadata, "version", real_version)

    def setup_model_and_optimizer(model_type, model_provider_func=None, *, cfg_container=None):
        raise AssertionError("never called")
    monkeypatch.setattr(training, "setup_model_and_optimizer", setup_model_and_optimizer)
    with pytest.raises(RuntimeError, match=r"setup_model_and_optimizer\(model_type, .*differs from megatron-core 0.19.2"):
        gm.training.enable()
    monkeypatch.setattr(training, "setup_model_and_optimizer", original)
    assert not gm.training.enabled()
    assert tuple(inspect.signature(original).parameters) == gm.training.PARAMETERS


def test_megatron_parser_derives_g_and_counts_dp_x_g(training):
    import gtp.megatron as gm
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    for world, shards, g in ((4, 2, 2), (8, 4, 4), (4, 1, 1), (2, 2, 2)):
        args = _parse(world, shards)
        assert args.gtp_weight_remat_size == g  # Megatron-LM's own derivation from the knob
        assert args.data_parallel_size == world // g  # the replicate DP
        assert get_num_microbatches() == 16 // (2 * world)  # the calculator counts DP x G data ranks
        s = gm.training.sizes_from_args(args)
        assert (s.gtp, s.dp, s.data_ranks) == (g, world // g, world)
        assert (s.gtp, s.dp) == (gm.derive_sizes(world, num_weight_shards=shards).gtp,
                                 gm.derive_sizes(world, num_weight_shards=shards).dp)
        assert gm.microbatches(16, 2, gm.derive_sizes(world, num_weight_shards=shards)) == get_num_microbatches()
    with pytest.raises(ValueError, match=r"tensor_parallel_num_weight_shards \(3\)"):
        _parse(4, 3, "--tensor-model-parallel-size", "2")  # Megatron's own refusal, kept
    with pytest.raises(AssertionError, match="world size \\(6\\) is not divisible"):
        _parse(6, 4)


@pytest.mark.parametrize("flags,fix", [
    (["--cuda-graph-impl", "local"], "cuda_graph_impl='none'"),
    (["--delay-wgrad-compute"], "delay_wgrad_compute=False"),
    (["--bf16", "--fp8-format", "hybrid"], "fp8_recipe='tensorwise'"),
    (["--ckpt-format", "torch", "--save", "/nonexistent-ckpt", "--save-interval", "10"], "--ckpt-format torch_dist"),
])
def test_refusals_from_parsed_arguments_name_the_fix(training, flags, fix):
    import gtp.megatron as gm
    try:
        args = _parse(4, 2, *flags)
    except (AssertionError, ValueError) as error:  # Megatron refused it itself: nothing for libgtp to add
        pytest.fail(f"Megatron-LM refused {flags} itself ({error}); pick flags it accepts")
    with pytest.raises(RuntimeError, match=fix.replace("(", r"\(").replace(")", r"\)")):
        gm.training.check_args(args)
    args = _parse(4, 2, "--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise")
    assert gm.training.check_args(args).gtp == 2  # current scaling is run
    args = _parse(4, 2, "--calculate-per-token-loss")
    assert gm.training.check_args(args).gtp == 2  # use_libgtp gets sum_grads from it: consistent
    args = _parse(4, 2, "--overlap-param-gather", "--use-distributed-optimizer", "--overlap-grad-reduce")
    assert gm.training.check_args(args).gtp == 2  # re-packed after each bucket's all-gather (param_gather.py)


def _wiring(rank, world, store_dir, per_token):
    """A rank at G = 2: Megatron-LM's parsed arguments, its parallel state, then the wrapped setup."""
    import torch
    training = _import_training()
    import gtp.megatron as gm
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import ColumnParallelLinear, gtp_api
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.training.utils import is_gtp_remat_active
    args = _parse(world, 2, *(["--calculate-per-token-loss"] if per_token else []))
    os.environ["RANK"] = str(rank)
    store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world)
    # What Megatron-LM's initialize_megatron does with the parsed G (it requires CUDA itself).
    ps.initialize_model_parallel(gtp_remat_size=args.gtp_weight_remat_size, create_gloo_process_groups=False)
    seen = {}

    def setup_model_and_optimizer(model_type, model_provider_func=None, checkpointing_context=None, *,
                                  cfg_container=None, pg_collection=None):
        """TEST DOUBLE of Megatron-LM's function (its get_model moves the model to CUDA): its GTP steps in
        its order (configure, build, classify), through gtp_api, with a Megatron-Core layer as the model."""
        seen["libgtp_at_entry"] = gm.active() is not None
        if is_gtp_remat_active(args):
            gtp_api.configure_gtp_remat_from_recipe(calculate_per_token_loss=args.calculate_per_token_loss)
        config = ModelParallelConfig(use_cpu_initialization=True, params_dtype=torch.bfloat16)
        model = ColumnParallelLinear(64, 32, config=config, init_method=torch.nn.init.normal_, bias=False)
        model.config = config
        config.calculate_per_token_loss = args.calculate_per_token_loss  # as core_transformer_config_from_args
        if is_gtp_remat_active(args):
            gtp_api.classify_gtp_remat_chains([model])
        return [model], "optimizer", "scheduler"

    original = training.setup_model_and_optimizer
    training.setup_model_and_optimizer = setup_model_and_optimizer
    try:
        gm.training.enable(backend="host")
        model, optimizer, scheduler = training.setup_model_and_optimizer("model_type", None, {})
        backend = gm.active()
        weight = model[0].weight
        out = {"libgtp_at_entry": seen["libgtp_at_entry"], "recipe": dict(backend.recipe),
               "sum_grads": backend.context.sum_grads, "weight": type(weight).__name__,
               "named": getattr(weight, "_debug_name", None), "rest": (optimizer, scheduler),
               "g": backend.context.sizes.gtp_remat}
        gm.training.disable()
        out["reset"] = gm.active() is None and training.setup_model_and_optimizer is setup_model_and_optimizer
    finally:
        training.setup_model_and_optimizer = original
    return out


@pytest.mark.parametrize("per_token", [False, True], ids=["mean", "per_token_sum"])
def test_wrapper_attaches_libgtp_before_the_build_at_g2(per_token):
    for r in run_ranks(_wiring, 2, per_token, timeout_s=420):
        assert r["libgtp_at_entry"]  # attached after the process groups, before Megatron's configure / build
        assert r["g"] == 2
        assert r["recipe"]["calculate_per_token_loss"] is per_token  # Megatron's configure reached libgtp's
        assert r["sum_grads"] is per_token  # --calculate-per-token-loss: libgtp sums the G axis
        assert r["weight"] == "MegatronParameter"  # Megatron-Core's layer went on libgtp
        assert r["named"] == "weight"  # Megatron's classify reached libgtp's
        assert r["rest"] == ("optimizer", "scheduler")
        assert r["reset"]

"""libgtp under Megatron-LM's own training loop (`megatron.training.pretrain`, Megatron-Core 0.19.2's
wheel). See docs/megatron.md (Megatron-LM's pretrain).

    import gtp.megatron
    gtp.megatron.training.enable()      # the one line, before pretrain(...); keywords go to use_libgtp
    pretrain(cfg, datasets_provider, ModelType.encoder_or_decoder, forward_step, model_provider=...)

Megatron-LM has no hook between its process groups and its model build, so enable() wraps the one
function in which Megatron-LM configures GTP (`megatron.training.training.setup_model_and_optimizer`:
configure_gtp_remat_from_recipe before the build, classify_gtp_remat_chains after every chunk is built
and DDP-wrapped), after checking Megatron-Core's version and that function's signature. The wrapper
refuses, from the parsed arguments, what libgtp does not run; attaches libgtp (use_libgtp) when the
process groups exist; runs Megatron-LM's own function, whose gtp_api calls then reach libgtp; and checks
the built model's config (check_training). Megatron-LM keeps its own derivation of G (arguments.py),
its refusals, its DP x G data accounting and its checkpoints."""
import functools
import importlib
import importlib.metadata
import inspect

CORE_VERSION = "0.19.2"
MODULE = "megatron.training.training"
FUNCTION = "setup_model_and_optimizer"
# The parameters of the wrapped function, in order, that pretrain passes and the wrapper forwards.
PARAMETERS = ("model_type", "model_provider_func", "checkpointing_context", "cfg_container", "pg_collection")

_ENABLED = None  # (the original function, use_libgtp's keywords) while enabled


def check_version():
    try:
        found = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found != CORE_VERSION:
        raise RuntimeError(f"gtp.megatron.training wraps {MODULE}.{FUNCTION} of megatron-core {CORE_VERSION}; "
                           f"found megatron-core {found}: install megatron-core=={CORE_VERSION}")


def check_signature(function):
    got = tuple(inspect.signature(function).parameters)
    if got[:len(PARAMETERS)] != PARAMETERS:
        raise RuntimeError(f"gtp.megatron.training: {MODULE}.{FUNCTION}{inspect.signature(function)} differs from "
                           f"megatron-core {CORE_VERSION}'s (parameters {PARAMETERS}); use megatron-core {CORE_VERSION}")


def sizes_from_args(args):
    """G, EG and the replicate DP as Megatron-LM's validate_args derived them (it refuses bad knobs itself)."""
    from types import SimpleNamespace
    return SimpleNamespace(gtp=int(getattr(args, "gtp_weight_remat_size", 1)),
                           expert_gtp=int(getattr(args, "expert_gtp_weight_remat_size", 1)),
                           dp=int(args.data_parallel_size),
                           data_ranks=int(args.data_parallel_size) * int(getattr(args, "gtp_weight_remat_size", 1)))


def check_args(args, machinery_at_g1=False):
    """Refuses, from Megatron-LM's parsed arguments and before the model is built, what the libgtp backend
    does not run (each error names the flag and the fix); the same settings check_training refuses."""
    from .backend import check_config, check_recipe
    s = sizes_from_args(args)
    libgtp_weights = s.gtp > 1 or s.expert_gtp > 1 or machinery_at_g1
    if getattr(args, "use_torch_fsdp2", False):
        raise RuntimeError("--use-torch-fsdp2 shards the same weights libgtp shards: train with DDP under "
                           "gtp.megatron.training.enable()")
    if libgtp_weights and getattr(args, "ckpt_format", "torch_dist") != "torch_dist" and (args.save or args.load):
        raise RuntimeError(f"--ckpt-format {args.ckpt_format}: libgtp shards are saved through Megatron-Core's sharded "
                           "state dict only: use --ckpt-format torch_dist")
    check_config(args, args)  # the argument names are the config's: cuda_graph_impl, delay_wgrad_compute, ...
    check_recipe({"calculate_per_token_loss": getattr(args, "calculate_per_token_loss", False),
                  "fp8": getattr(args, "fp8", None), "fp8_recipe": getattr(args, "fp8_recipe", None),
                  "fp4": getattr(args, "fp4", None)},
                 _GroupSizes(s.gtp, s.expert_gtp), bool(getattr(args, "calculate_per_token_loss", False)))
    return s


class _GroupSizes:
    def __init__(self, gtp, expert_gtp):
        self.gtp_remat, self.expert_gtp_remat = gtp, expert_gtp


def enable(*, wire="bf16", **use_libgtp_kwargs):
    """Makes Megatron-LM's pretrain(...) (megatron-core 0.19.2) train every GTP weight on libgtp. `wire` and
    the other keywords go to gtp.megatron.use_libgtp (machinery_at_g1, profile, prefetch_depth, ...;
    sum_grads is Megatron-LM's --calculate-per-token-loss). Call it once before pretrain; disable() undoes it."""
    global _ENABLED
    if "sum_grads" in use_libgtp_kwargs:
        raise TypeError("gtp.megatron.training.enable(sum_grads=...): Megatron-LM's --calculate-per-token-loss sets it")
    check_version()
    module = importlib.import_module(MODULE)
    current = getattr(module, FUNCTION, None)
    if current is None:
        raise RuntimeError(f"gtp.megatron.training: {MODULE}.{FUNCTION} is missing (megatron-core {CORE_VERSION} has it)")
    original = getattr(current, "_gtp_original", current)
    check_signature(original)
    kwargs = {"wire": wire, **use_libgtp_kwargs}

    @functools.wraps(original)
    def setup_model_and_optimizer(model_type, model_provider_func=None, checkpointing_context=None, *args_, **kw):
        return _setup_on_libgtp(original, kwargs, model_type, model_provider_func, checkpointing_context, *args_, **kw)
    setup_model_and_optimizer._gtp_original = original
    setattr(module, FUNCTION, setup_model_and_optimizer)
    _ENABLED = (original, kwargs)
    return setup_model_and_optimizer


def disable():
    """Restores Megatron-LM's function and closes libgtp (gtp.megatron.reset; collective when a context is open)."""
    global _ENABLED
    from . import reset
    enabled, _ENABLED = _ENABLED, None
    if enabled is not None:
        setattr(importlib.import_module(MODULE), FUNCTION, enabled[0])
    reset()


def enabled():
    return _ENABLED is not None


def _setup_on_libgtp(original, kwargs, model_type, model_provider_func, checkpointing_context, *args_, **kw):
    from megatron.core.utils import get_model_config
    from megatron.training import get_args
    from . import active, check_training, use_libgtp
    args = get_args()
    machinery = bool(kwargs.get("machinery_at_g1", False))
    s = check_args(args, machinery)
    if active() is None:  # the process groups exist (initialize_megatron); nothing is built yet
        use_libgtp(sum_grads=bool(getattr(args, "calculate_per_token_loss", False)), **kwargs)
    result = original(model_type, model_provider_func, checkpointing_context, *args_, **kw)
    model = result[0]
    chunk = model[0]
    check_training(get_model_config(chunk), getattr(chunk, "ddp_config", None))
    if machinery and s.gtp == 1 and s.expert_gtp == 1:
        # Megatron-LM classifies chains only at G > 1; with the machinery on at G = 1 libgtp's weights
        # are named and chained per chunk the same way.
        from megatron.core.tensor_parallel import gtp_api
        gtp_api.classify_gtp_remat_chains(model)
    return result

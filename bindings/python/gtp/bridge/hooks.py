"""Where gtp.bridge enters Megatron Bridge 0.6.2. Public first: the provider's post-wrap hook
(chains). Where Bridge has no hook, the named function is wrapped in the one Bridge module that calls
it, after checking Bridge's version and the function's signature (a refusal names both otherwise):

  initialize._initialize_distributed   G, EG into initialize_model_parallel; libgtp attached after it
  initialize/pretrain.destroy_global_state   libgtp reset with Bridge's global state
  setup.setup_data_iterators           data loaders over the DP x G data group
  pretrain.train                       the training loop's groups: dp = DP x G, dp_cp = dp_cp_gtp_remat
  checkpointing/eval.get_pg_collection the same view for checkpoint save/load and evaluation

Megatron-LM's contract for those counts: docs/bridge.md (Data accounting)."""
import contextlib
import copy
import functools
import importlib
import importlib.metadata
import inspect

BRIDGE_VERSION = "0.6.2"
CORE_VERSION = "0.19.2"

# module, function, the parameters this code relies on (in order)
WRAPPED = (
    ("megatron.bridge.training.initialize", "_initialize_distributed",
     ("model_config", "dist_config", "num_distributed_optimizer_instances", "get_embedding_ranks",
      "get_position_embedding_ranks", "restart_store", "use_inprocess_restart")),
    ("megatron.bridge.training.initialize", "destroy_global_state", ()),
    ("megatron.bridge.training.pretrain", "destroy_global_state", ()),
    ("megatron.bridge.training.setup", "setup_data_iterators",
     ("cfg", "train_state", "model_length", "train_valid_test_datasets_provider", "dp_group", "eval_dp_group")),
    ("megatron.bridge.training.pretrain", "train",
     ("forward_step_func", "model", "optimizer", "scheduler", "train_data_iterator", "valid_data_iterator",
      "global_state", "checkpoint_manager", "pg_collection")),
    ("megatron.bridge.training.checkpointing", "get_pg_collection", ("model",)),
    ("megatron.bridge.training.eval", "get_pg_collection", ("model",)),
)
INIT_MODEL_PARALLEL_KWARGS = ("gtp_remat_size", "expert_gtp_remat_size")


def check_versions():
    found = {}
    for dist, wanted in (("megatron-bridge", BRIDGE_VERSION), ("megatron-core", CORE_VERSION)):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    wrong = {d: v for d, v in found.items() if v != {"megatron-bridge": BRIDGE_VERSION, "megatron-core": CORE_VERSION}[d]}
    if wrong:
        raise RuntimeError(f"gtp.bridge wraps functions of megatron-bridge {BRIDGE_VERSION} on megatron-core {CORE_VERSION}; "
                           f"found {found}: install those versions (tools/constraints-bridge.txt)")


def _parameters(fn):
    return tuple(inspect.signature(getattr(fn, "_gtp_original", fn)).parameters)


def check_signatures():
    """Every wrapped function still takes the parameters gtp.bridge passes and reads."""
    for module_name, name, wanted in WRAPPED:
        module = importlib.import_module(module_name)
        fn = getattr(module, name, None)
        if fn is None:
            raise RuntimeError(f"gtp.bridge: {module_name}.{name} is missing (megatron-bridge {BRIDGE_VERSION} has it)")
        got = _parameters(fn)
        if got[:len(wanted)] != wanted:
            raise RuntimeError(f"gtp.bridge: {module_name}.{name}{inspect.signature(fn)} differs from megatron-bridge "
                               f"{BRIDGE_VERSION}'s (parameters {wanted}); use megatron-bridge {BRIDGE_VERSION}")
    from megatron.core import parallel_state
    missing = [k for k in INIT_MODEL_PARALLEL_KWARGS
               if k not in inspect.signature(parallel_state.initialize_model_parallel).parameters]
    if missing:
        raise RuntimeError(f"megatron.core.parallel_state.initialize_model_parallel lacks {missing}: use megatron-core "
                           f"{CORE_VERSION}")


def data_view(pg_collection, sizes):
    """Bridge's training loop reads `dp` as the data group and `dp_cp` as the data x context group, as
    they are without GTP. Under GTP Megatron-Core's `dp` / `dp_cp` are the replicate groups (DDP, the
    optimizer); the data groups span G too. The view (a copy) holds those; the model and DDP keep the
    original. At G = EG = 1 the collection is returned as it is."""
    if pg_collection is None or (sizes.gtp == 1 and sizes.expert_gtp == 1):
        return pg_collection
    if getattr(pg_collection, "_gtp_data_view", False):
        return pg_collection
    from megatron.core import parallel_state
    view = copy.copy(pg_collection)
    view.dp = parallel_state.get_data_parallel_group(with_context_parallel=False, with_gtp_remat=True)
    view.dp_cp = parallel_state.get_data_parallel_group(with_context_parallel=True, with_gtp_remat=True)
    view._gtp_data_view = True
    return view


@contextlib.contextmanager
def _gtp_into_initialize_model_parallel(gtp, expert_gtp):
    """While Bridge's _initialize_distributed runs: its initialize_model_parallel call also gets G and EG."""
    from megatron.core import parallel_state
    original = parallel_state.initialize_model_parallel

    @functools.wraps(original)
    def with_gtp(*args, **kwargs):
        for key, value in (("gtp_remat_size", gtp), ("expert_gtp_remat_size", expert_gtp)):
            if kwargs.get(key, value) != value:
                raise RuntimeError(f"initialize_model_parallel got {key}={kwargs[key]}, the config says {value}")
            kwargs[key] = value
        return original(*args, **kwargs)
    parallel_state.initialize_model_parallel = with_gtp
    try:
        yield
    finally:
        parallel_state.initialize_model_parallel = original


class Hooks:
    """The wrappers, bound to the enabled config; install / uninstall are idempotent."""

    def __init__(self, state):
        self.state = state          # gtp.bridge's _State: cfg, use_libgtp kwargs, sizes
        self.saved = []

    def install(self):
        if self.saved:
            return
        check_versions()
        check_signatures()
        makers = {"_initialize_distributed": self._initialize_distributed, "destroy_global_state": self._destroy,
                  "setup_data_iterators": self._setup_data_iterators, "train": self._train,
                  "get_pg_collection": self._get_pg_collection}
        for module_name, name, _ in WRAPPED:
            module = importlib.import_module(module_name)
            original = getattr(module, name)
            wrapper = functools.wraps(original)(makers[name](original))
            wrapper._gtp_original = original
            self.saved.append((module, name, original))
            setattr(module, name, wrapper)

    def uninstall(self):
        while self.saved:
            module, name, original = self.saved.pop()
            setattr(module, name, original)

    # -- the wrappers --
    def _initialize_distributed(self, original):
        state = self.state

        def wrapper(*args, **kwargs):
            from megatron.core import parallel_state
            from .. import megatron as gm
            from .checks import check
            state.sizes = sizes = check(state.cfg)
            with _gtp_into_initialize_model_parallel(sizes.gtp, sizes.expert_gtp):
                pg_collection = original(*args, **kwargs)
            got = (parallel_state.get_gtp_weight_remat_world_size() or 1,
                   parallel_state.get_expert_gtp_weight_remat_world_size() or 1)
            if got != (sizes.gtp, sizes.expert_gtp):
                raise RuntimeError(f"megatron.core.parallel_state has G, EG = {got}, the config {sizes.gtp, sizes.expert_gtp}: "
                                   "it was initialized before Bridge's setup; let Bridge initialize it (or call "
                                   "parallel_state.destroy_model_parallel() first)")
            if getattr(pg_collection, "gtp_remat", None) is None and sizes.gtp > 1:
                raise RuntimeError("Bridge's process-group collection has no gtp_remat group at G > 1")
            gm.reset()  # a rebuilt model gets a new libgtp context
            gm.use_libgtp(**state.libgtp_kwargs)
            gm.check_training(state.cfg.model, state.cfg.ddp)
            return pg_collection
        return wrapper

    def _destroy(self, original):
        def wrapper(*args, **kwargs):
            from .. import megatron as gm
            gm.reset()
            return original(*args, **kwargs)
        return wrapper

    def _setup_data_iterators(self, original):
        state = self.state
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            sizes = state.sizes
            if sizes is not None and (sizes.gtp > 1 or sizes.expert_gtp > 1):
                if bound.arguments.get("eval_dp_group") is not None:
                    raise RuntimeError("separate evaluation process groups (state._eval_pgs) under GTP are not "
                                       "supported by gtp.bridge: evaluate on the training groups")
                from megatron.core import parallel_state
                bound.arguments["dp_group"] = parallel_state.get_data_parallel_group(with_gtp_remat=True)
            return original(*bound.args, **bound.kwargs)
        return wrapper

    def _train(self, original):
        state = self.state
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            if state.sizes is not None:
                bound.arguments["pg_collection"] = data_view(bound.arguments["pg_collection"], state.sizes)
            return original(*bound.args, **bound.kwargs)
        return wrapper

    def _get_pg_collection(self, original):
        state = self.state

        def wrapper(model):
            pg_collection = original(model)
            return data_view(pg_collection, state.sizes) if state.sizes is not None else pg_collection
        return wrapper

"""gtp.megatron: libgtp as Megatron-Core 0.19's GTP backend. See docs/megatron.md.

    parallel_state.initialize_model_parallel(...)      # as usual (any tensor_parallel_num_weight_shards)
    gtp.megatron.use_libgtp(wire="bf16")               # before the model is built
    model = GPTModel(config, get_gpt_layer_with_transformer_engine_spec(...), ...)
    model = DistributedDataParallel(config, ddp_config, model)
    gtp.megatron.check_training(config, ddp_config)    # refuses, before training, what is not supported
    ... Megatron's own training loop, optimizer, finalize_model_grads, dist_checkpointing ...
    gtp.megatron.reset()                               # before building another model in this process

Under Megatron-LM's own loop (megatron.training.pretrain): gtp.megatron.training.enable() before pretrain.

Every TE layer Megatron-Core builds (te.Linear, te.LayerNormLinear, te.GroupedLinear experts) in a
group of G > 1 then holds a libgtp shard of its weight; at G > 1 Megatron's own embedding and output
layer go on libgtp too. In a group of one the layers are left as Megatron-Core builds them without
GTP (its own GTP is inert at size 1 the same way), unless use_libgtp(machinery_at_g1=True) puts its
TE layers on libgtp at G = 1 too."""
import torch

from . import training  # Megatron-LM's pretrain on libgtp: gtp.megatron.training.enable()
from .backend import API_NAMES, Backend, check_config
from .param import EmbeddingWeight, MegatronParameter
from .sizes import (MegatronSizes, check_groups, consumed_samples, derive_sizes, microbatches,
                    sizes_from_parallel_state, weight_shards_to_gtp)

__all__ = ["training", "use_libgtp", "reset", "active", "check_training", "MegatronParameter", "EmbeddingWeight", "MegatronSizes", "derive_sizes",
           "microbatches", "consumed_samples", "weight_shards_to_gtp", "sizes_from_parallel_state", "API_NAMES"]

_BACKEND = None


def _profile(sizes, profile):
    """A libgtp profile whose `parallel` object is Megatron's sizes; the cluster is the caller's, else
    one host with world_size GPUs on one NUMA node holding the CPUs this process may run on (the
    placement rules then only warn)."""
    import json
    import os
    if profile is None:
        cpus = sum(1 << cpu for cpu in os.sched_getaffinity(0))
        words = []  # hwloc's bitmap syntax: 32-bit words, most significant first, comma-separated
        while cpus or not words:
            words.insert(0, f"0x{cpus & 0xffffffff:08x}")
            cpus >>= 32
        profile = {"schema_version": 1, "cluster": {"template": {"host_count": 1, "host": {
            "numa_nodes": [{"os_index": 0, "cpuset": ",".join(words)}],
            "gpus": [{"index": i, "numa_node": 0} for i in range(sizes.world_size)]}}}}
    elif isinstance(profile, str):
        profile = json.loads(profile)
    else:
        profile = dict(profile)
    given = profile.get("parallel")
    wanted = sizes.profile_parallel()
    if given is not None:
        differing = {k: (given.get(k), v) for k, v in wanted.items() if k in given and given[k] != v}
        if differing:
            raise ValueError(f"the profile's parallel sizes differ from Megatron-Core's parallel state: "
                             f"{differing} (profile, Megatron); drop them from the profile, gtp.megatron fills them in")
    profile["parallel"] = {**(given or {}), **wanted}
    return json.dumps(profile)


def use_libgtp(*, wire="bf16", backend=None, store=None, profile=None, prefetch_depth=None,
               memory_budget_bytes=None, timeout_s=300.0, check=True, machinery_at_g1=False, sum_grads=None):
    """Makes Megatron-Core use libgtp for every GTP weight built from now on. Call it after
    parallel_state.initialize_model_parallel and before the model is built; collective (every rank).

    wire: what libgtp gathers ("bf16", "fp8", "mxfp8", "nvfp4"; docs/python.md); backend: "cuda"
    (default when CUDA is available) or "host" (CPU tensors); store: a torch.distributed Store for
    libgtp's bootstrap (default: the default process group's); profile: a libgtp profile (dict, JSON
    text) for its cluster and group settings; its `parallel` sizes are Megatron's; check: verify that
    libgtp's groups hold the ranks of Megatron's (one all_gather_object); machinery_at_g1: put the TE
    layers of a group of one on libgtp too (default False: inert there, as Megatron-Core's GTP at
    size 1; gtp.torch.Context's keyword); sum_grads: reduce-scatter the sum over G instead of the mean,
    as Megatron's GTP does under calculate_per_token_loss (default None: what Megatron-Core's GTP config
    says, which configure_gtp_remat_from_recipe sets before the model is built; check_training refuses
    a config that disagrees). Returns the gtp.torch.Context."""
    global _BACKEND
    if _BACKEND is not None:
        raise RuntimeError("gtp.megatron.use_libgtp() was already called in this process: call "
                           "gtp.megatron.reset() first to build models on a new context")
    if not torch.distributed.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group and "
                           "parallel_state.initialize_model_parallel before gtp.megatron.use_libgtp()")
    from megatron.core import parallel_state as ps
    from .. import torch as gt
    sizes = sizes_from_parallel_state()
    if backend is None:
        backend = "cuda" if torch.cuda.is_available() else "host"
    if store is None:
        store = torch.distributed.distributed_c10d._get_default_store()
        store = torch.distributed.PrefixStore("gtp.megatron", store)
    # One rank without a profile: libgtp's own defaults are exactly these sizes (all 1), as the
    # gtp.torch TE runs use them; otherwise the profile carries Megatron's sizes.
    profile_json = None if profile is None and sizes.world_size == 1 else _profile(sizes, profile)
    if sum_grads is None:
        from megatron.core.tensor_parallel import generalized_tensor_parallelism as mgtp
        sum_grads = bool(mgtp.GTP_CONFIG.calculate_per_token_loss)
    context = gt.Context(store, torch.distributed.get_rank(), sizes.world_size, backend=backend,
                         profile_json=profile_json, prefetch_depth=prefetch_depth,
                         memory_budget_bytes=memory_budget_bytes, timeout_s=timeout_s,
                         machinery_at_g1=machinery_at_g1, sum_grads=bool(sum_grads))
    try:
        if check:
            check_groups(context)
        new = Backend(context, wire, ps.get_gtp_weight_remat_group(check_initialized=False),
                      ps.get_expert_gtp_weight_remat_group(check_initialized=False))
        new.sizes = sizes
        new.install()
    except BaseException:
        context.close()
        raise
    _BACKEND = new
    return context


def check_training(config, ddp_config=None):
    """Refuses, before training, the Megatron settings the libgtp backend does not run (each error
    names the setting and the fix): CUDA graphs, delayed wgrads, FP8 primary weights, Megatron FSDP; with
    use_libgtp active also a per-token-loss setting that differs from the context's sum_grads at G > 1,
    and FP8 / FP4 recipes other than tensorwise (current scaling)."""
    check_config(config, ddp_config)
    if _BACKEND is not None:
        from .backend import check_recipe
        check_recipe({"calculate_per_token_loss": getattr(config, "calculate_per_token_loss", False),
                      "fp8": getattr(config, "fp8", None), "fp8_recipe": getattr(config, "fp8_recipe", None),
                      "fp4": getattr(config, "fp4", None)}, _BACKEND.context.sizes, _BACKEND.context.sum_grads)


def active():
    """The running Backend (context, params, modules), or None."""
    return _BACKEND


def reset():
    """Undoes use_libgtp: Megatron-Core's own GTP functions are back, the libgtp context is closed
    (collective) and its weights unregistered. Models built on it must not be used afterwards."""
    global _BACKEND
    backend, _BACKEND = _BACKEND, None
    if backend is None:
        return
    backend.uninstall()
    backend.params.clear()
    backend.modules.clear()
    backend.context.close()

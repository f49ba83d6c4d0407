"""gtp.torch.te: puts TransformerEngine layers on libgtp. `distribute(module, context)` replaces the
weights of the TE layers in `module` by ShardedParameters, which TE 2.20's layers then drive through
their DistributedWeight hooks alone: te.Linear, te.LayerNormLinear (one weight each) and
te.GroupedLinear (its weight0..weightN-1 as one libgtp expert group). See docs/python.md,
"TransformerEngine"."""
import torch

from .parameter import ShardedParameter

# TE layers that take a DistributedWeight, by class name (TE itself is imported by the caller).
_ONE_WEIGHT = ("Linear", "LayerNormLinear")
_UNSUPPORTED = {
    "LayerNormMLP": "te.LayerNormMLP calls no DistributedWeight hook (TE 2.20 gathers nothing for its fc1 "
                    "and fc2 weights): build the block from te.LayerNormLinear (fc1) and te.Linear (fc2), which do",
}


def _te_class(module):
    """The TE class a layer is (or derives from: Megatron's TELinear is a te.Linear), else None."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("transformer_engine.pytorch"):
            return cls
    return None


def _te_layer_kind(module):
    cls = _te_class(module)
    if cls is None:
        return None
    if cls.__name__ in _UNSUPPORTED:
        return "unsupported"
    if cls.__name__ in _ONE_WEIGHT:
        return "one"
    if cls.__name__ == "GroupedLinear":
        return "grouped"
    return None


def _shard_of(weight, context, name, wire, group, leader, register_kwargs, param_class=ShardedParameter):
    rows, cols = weight.shape
    g = context.geometry(rows, cols, wire, group)
    shard = weight.detach()[g.row_start:g.row_start + g.valid_rows].contiguous()
    param = param_class(shard, context, name, rows, cols, wire, group, leader, **register_kwargs)
    param.requires_grad_(weight.requires_grad)
    for key, value in vars(weight).items():  # the framework's tags (TE's tensor_model_parallel, ...)
        if not hasattr(param, key):
            setattr(param, key, value)
    return param


def distribute(module, context, *, wire="bf16", group=None, expert_group="expert_gtp_remat", prefix=None,
               param_class=ShardedParameter, **register_kwargs):
    """Shards the weight of every TE layer in `module` (itself included) over `context`'s groups and
    returns the new ShardedParameters in order. Collective: every rank of a group calls it with the same
    model, in the same order. Each weight keeps this rank's rows of its current value (build the model
    with the same seed on every rank, or load a checkpoint after).

    wire: "bf16", "fp8", "mxfp8" or "nvfp4" (under a TE FP8 recipe the FP8 wire is handed to TE's
    Float8CurrentScaling GEMMs as a Float8Tensor; docs/python.md); group: the group of te.Linear and
    te.LayerNormLinear weights (default "gtp_remat"); expert_group: te.GroupedLinear's (its experts);
    prefix: the weights' names in libgtp (default: the module paths); param_class: a ShardedParameter
    subclass to create (gtp.megatron's adds Megatron's names); register_kwargs: as ShardedParameter's
    (nvfp4_2d, mx_rounding, gemm_scales). Attributes a framework set on the old weights are copied.
    Refuses, before changing anything, TE layers that cannot take a distributed weight (te.LayerNormMLP),
    layers with split parameters, single grouped weights, delayed wgrads and quantized primary weights
    (at every G, so a model that builds at G = 1 builds at G > 1 too).
    In a group of one (G = 1) the layers are left as they are unless the context has machinery_at_g1=True:
    TE then runs exactly as without GTP (its own weight, its own quantization, its wgrad accumulation
    into main_grad under fuse_wgrad_accumulation), as Megatron-Core's GTP is inert at size 1; their
    weights are not in the returned list."""
    group = group or "gtp_remat"
    targets = []
    for path, sub in module.named_modules():
        kind = _te_layer_kind(sub)
        where = path or type(module).__name__
        if kind == "unsupported":
            raise ValueError(f"{where}: {_UNSUPPORTED[_te_class(sub).__name__]}")
        if kind == "one" and list(sub.weight_names) != ["weight"]:
            raise ValueError(f"{where}: a {type(sub).__name__} with parameters_split {sub.weight_names} has "
                             "several weights in one layer; build it without parameters_split to distribute it")
        store = getattr(sub, "wgrad_store", None)
        if kind in ("one", "grouped") and store is not None and store.delay_wgrad_compute():
            raise ValueError(f"{where}: delay_wgrad_compute=True defers the wgrad to TE's wgrad_store, which never "
                             "calls finalize_group_grads (the gradient would never be reduce-scattered); build the "
                             "layer without delay_wgrad_compute to distribute it")
        if kind == "grouped" and getattr(sub, "weight", None) is not None:
            raise ValueError(f"{where}: a GroupedLinear with single_grouped_weight=True keeps its experts in one "
                             "GroupedTensor; build it with single_grouped_weight=False to distribute it")
        if kind is not None:
            targets.append((path, kind, sub))
    for path, kind, sub in targets:  # checked first, so a refusal changes nothing
        names = ["weight"] if kind == "one" else [f"weight{i}" for i in range(sub.num_gemms)]
        for name in names:
            w = getattr(sub, name)
            if type(w) is not torch.nn.Parameter or w.dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"{path}.{name} is a {type(w).__name__} of {w.dtype}: distribute() shards plain "
                                 "FP32 or BF16 parameters (build TE layers without fp8_model_init; the FP8 wire "
                                 "quantizes them instead)")
    created = []
    for path, kind, sub in targets:
        if not context.uses_libgtp(group if kind == "one" else expert_group):
            continue  # inert at G = 1: TE's own layer, untouched
        base = ".".join(p for p in (prefix, path) if p) or type(sub).__name__.lower()
        if kind == "one":
            param = _shard_of(sub.weight, context, f"{base}.weight", wire, group, None, register_kwargs,
                              param_class)
            sub.register_parameter("weight", param)
            context.shard_updated([param])
            created.append(param)
            continue
        leader = None
        for i in range(sub.num_gemms):
            param = _shard_of(getattr(sub, f"weight{i}"), context, f"{base}.weight{i}", wire, expert_group, leader,
                              register_kwargs, param_class)
            if leader is None:
                leader = param
            sub.register_parameter(f"weight{i}", param)
            created.append(param)
        context.shard_updated([leader])  # the leader stands for its group
    return created

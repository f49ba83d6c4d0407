"""Routes Megatron-Core 0.19's gtp_api to libgtp (see gtp.megatron and docs/megatron.md).

Megatron-Core calls its GTP through megatron.core.tensor_parallel.gtp_api, imported lazily at every
call site except transformer/cuda_graphs.py (at module load). Replacing gtp_api's names (and
cuda_graphs' copies) before the model is built therefore makes every later call libgtp's. TE layers
are built by Megatron's TE extension under `_init_gtp_remat_context`; it is replaced too, so TE
layers go on libgtp (built full, then sliced to libgtp's rows). Like Megatron's, it does nothing in a
group of one (size <= 1, or no group), unless the context has machinery_at_g1=True."""
import contextlib
import sys

from ..torch import te as gtp_te
from . import checkpoint
from .param import EmbeddingWeight, MegatronParameter
from .param_gather import ParamGather

# The gtp_api names, each with libgtp's implementation below (installed by Backend.install).
API_NAMES = ("GTPChain", "GTPEmbeddingWeight", "attach_gtp_to_presharded_module", "classify_gtp_remat_chains",
             "configure_gtp_remat_from_recipe", "dequantize_gtp_native_fp8", "get_ag_stream", "get_rs_stream",
             "gtp_native_fp8_load_context", "gtp_remat_shard_dim0", "is_gtp_param",
             "make_sharded_tensors_for_checkpoint_with_gtp_remat", "set_cuda_graph_mempool", "wait_async_comms",
             "wait_for_gtp_grad_reduction_on_current_stream", "wrap_module_params_gtp")

_CUDA_GRAPHS = ("Megatron-Core's CUDA-graph runner drives its own GTP streams and chain tickets; the libgtp "
                "backend does not implement them: train without CUDA graphs (cuda_graph_impl='none', "
                "enable_cuda_graph=False), or without gtp.megatron.use_libgtp()")


_CPU_INIT = ("use_cpu_initialization=True makes Megatron-Core's TE layers write their initial weight after "
             "the layer is built, into what is by then libgtp's shard: build with use_cpu_initialization=False "
             "(the GPU initialization, the same values per TP rank)")


class Backend:
    """One libgtp context serving Megatron-Core's GTP weights, and the patches that route to it."""

    def __init__(self, context, wire="bf16", pg_gtp=None, pg_expert_gtp=None):
        self.context = context
        self.wire = wire
        self.groups = {"gtp_remat": pg_gtp, "expert_gtp_remat": pg_expert_gtp}
        self.params = []          # every MegatronParameter, in build order
        self.modules = []         # the layers whose weights are on libgtp
        self._saved = []          # (object, name, old value) to undo
        self._names = 0
        self._step_depth = 0
        self.recipe = {}
        self.param_gather = ParamGather(self)  # overlap_param_gather: re-packs that wait for DDP's all-gather

    # -- installing and removing the routes --
    def _set(self, obj, name, value):
        self._saved.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    def install(self):
        import importlib
        api = importlib.import_module("megatron.core.tensor_parallel.gtp_api")
        impl = self.implementations()
        self._set(api, "HAVE_GTP", True)
        for name in API_NAMES:
            self._set(api, name, impl[name])
        # cuda_graphs binds some names at its import; rebind them there (and HAVE_GTP, which it read).
        graphs = importlib.import_module("megatron.core.transformer.cuda_graphs")
        for name in ("GTPChain", "get_ag_stream", "get_rs_stream", "set_cuda_graph_mempool", "wait_async_comms"):
            self._set(graphs, name, impl[name])
        self._set(graphs, "HAVE_GTP", True)
        try:  # only with TransformerEngine
            te_ext = importlib.import_module("megatron.core.extensions.transformer_engine")
        except ImportError:
            te_ext = None
        if te_ext is not None:
            self._set(te_ext, "_init_gtp_remat_context", self._te_init_context)
        self._check_tp_sharded_tensors(importlib.import_module("megatron.core.utils"))
        layers = importlib.import_module("megatron.core.tensor_parallel.layers")
        self._set(layers.ColumnParallelLinear, "forward", _shard_passed_in(layers.ColumnParallelLinear.forward))
        self._patch_optimizers()
        self.param_gather.install()

    def _check_tp_sharded_tensors(self, utils):
        """Routes make_tp_sharded_tensor_for_checkpoint through checkpoint.checked_tp_sharded_tensor, in
        megatron.core.utils and in every Megatron module already holding its own copy of the name (a
        module imported later takes the routed one from utils)."""
        original = utils.make_tp_sharded_tensor_for_checkpoint
        checked = checkpoint.checked_tp_sharded_tensor(original)
        for name, module in list(sys.modules.items()):
            if name.startswith("megatron.") and getattr(module, "make_tp_sharded_tensor_for_checkpoint", None) is original:
                self._set(module, "make_tp_sharded_tensor_for_checkpoint", checked)

    def uninstall(self):
        while self._saved:
            obj, name, old = self._saved.pop()
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

    def _patch_optimizers(self):
        """After each (outermost) Megatron optimizer step, re-pack every libgtp shard from the
        parameters the optimizer just wrote (the distributed optimizer's copy into DDP's buffer
        included): Context.shard_updated copies a replaced storage back first. Weights in a DDP
        bucket group whose overlapped parameter all-gather has not run yet are re-packed when it has
        (param_gather.py)."""
        from megatron.core.optimizer import optimizer as opt
        backend = self
        for cls in (opt.MegatronOptimizer, *_subclasses(opt.MegatronOptimizer)):
            step = cls.__dict__.get("step")
            if step is None or getattr(step, "_gtp_wrapped", False):
                continue

            def wrapped(self_, *args, _orig=step, **kwargs):
                backend._step_depth += 1
                try:
                    result = _orig(self_, *args, **kwargs)
                finally:
                    backend._step_depth -= 1
                if backend._step_depth == 0 and backend.params:
                    backend.context.optimizer_stepped()  # the next step's last drain defers its head
                    now = backend.param_gather.after_step(backend.leaders())
                    if now:  # none: the deferred head waits for the first re-pack after a bucket all-gather
                        backend.context.shard_updated(now)
                return result
            wrapped._gtp_wrapped = True
            wrapped.__doc__ = step.__doc__
            self._set(cls, "step", wrapped)

    def group_name(self, process_group):
        """libgtp's group for one of Megatron's GTP process groups (the dense one unless it is the expert one)."""
        expert = self.groups["expert_gtp_remat"]
        if process_group is not None and process_group is expert and expert is not self.groups["gtp_remat"]:
            return "expert_gtp_remat"
        return "gtp_remat"

    def leaders(self):
        return [p for p in self.params if p.group_members and p.group_members[0] is p]

    # -- putting layers on libgtp --
    def _name(self, module):
        self._names += 1
        return f"megatron{self._names}.{type(module).__name__}"

    def _tag(self, params):
        from megatron.core import parallel_state
        chunk = parallel_state.get_virtual_pipeline_model_parallel_rank() if \
            parallel_state.get_virtual_pipeline_model_parallel_world_size() else None
        for p in params:
            p.group = self.groups.get(p.gtp_weight.group)
            p.model_chunk = int(chunk or 0)
            self.params.append(p)

    def distribute_te(self, module, is_expert=False):
        group = "expert_gtp_remat" if is_expert else "gtp_remat"
        params = gtp_te.distribute(module, self.context, wire=self.wire, group=group, expert_group="expert_gtp_remat",
                                   prefix=self._name(module), param_class=MegatronParameter)
        self._tag(params)
        self._watch_loads(module)
        return params

    def _watch_loads(self, module):
        """A load_state_dict writes the parameters: re-pack this layer's shards after it."""
        backend = self
        if module in self.modules:
            return
        self.modules.append(module)

        def repack(mod, _incompatible):
            mine = [p for p in mod.parameters(recurse=False) if isinstance(p, MegatronParameter)]
            leaders = [p for p in mine if p.group_members[0] is p]
            if leaders:
                backend.context.shard_updated(leaders)
        module.register_load_state_dict_post_hook(repack)

    @contextlib.contextmanager
    def _te_init_context(self, module, output_size, gtp_remat_group, extra_kwargs, *, is_expert=False,
                         is_grouped=False, rng_via_kwarg=True, out_split_size=1):
        """Megatron's _init_gtp_remat_context on libgtp: TE builds the full TP-local weight (with the
        TP-region initialization a GTP-off run gets), then libgtp takes this rank's rows. In a group of
        one it returns before any GTP work, as Megatron's does (unless machinery_at_g1)."""
        del extra_kwargs, rng_via_kwarg, out_split_size, is_grouped
        if (gtp_remat_group is None or gtp_remat_group.size() <= 1) and not self.context.machinery_at_g1:
            yield output_size
            return
        if getattr(getattr(module, "config", None), "use_cpu_initialization", False):
            raise RuntimeError(_CPU_INIT)
        yield output_size
        self.distribute_te(module, is_expert=is_expert)

    # -- gtp_api, libgtp's versions --
    def implementations(self):
        from megatron.core.tensor_parallel import generalized_tensor_parallelism as mgtp
        backend = self

        def attach_gtp_to_presharded_module(module, gtp_remat_group, pad_length, is_grouped=False):
            raise RuntimeError(f"{type(module).__name__} was built pre-sharded by Megatron-Core's GTP ({pad_length} pad "
                               "rows); the libgtp backend shards TE layers itself: build the model after "
                               "gtp.megatron.use_libgtp(), through Megatron-Core's TE layer spec")

        def wrap_module_params_gtp(module, weight_names, gtp_remat_group, is_grouped=None):
            """Megatron's own layers (embedding, output layer) at G > 1: their full weights to libgtp.
            Megatron-Core calls it only at G > 1; like its own, it does nothing in a group of one."""
            group = backend.group_name(gtp_remat_group)
            if not backend.context.uses_libgtp(group):
                return
            members = []
            leader = None
            for name in weight_names:
                weight = getattr(module, name, None)
                if weight is None or isinstance(weight, MegatronParameter):
                    continue
                param = gtp_te._shard_of(weight, backend.context, f"{backend._name(module)}.{name}", backend.wire,
                                         group, leader if is_grouped else None, {}, MegatronParameter)
                leader = leader or param
                delattr(module, name)
                module.register_parameter(name, param)
                members.append(param)
            if members:
                backend.context.shard_updated([p for p in members if p.group_members[0] is p])
                backend._tag(members)
                backend._watch_loads(module)

        def classify_gtp_remat_chains(model, *, cuda_graph_modules=None, moe_shared_expert_overlap=False,
                                      cuda_graph_impl="none"):
            """After the build and DDP wrap: refuse what the backend does not run, name the weights,
            start libgtp's chains afresh (they are learnt from the first step's order)."""
            del moe_shared_expert_overlap
            if cuda_graph_modules or cuda_graph_impl not in (None, "none"):
                raise RuntimeError(_CUDA_GRAPHS)
            for index, chunk in enumerate(model if isinstance(model, list) else [model]):
                for name, p in chunk.named_parameters():
                    if isinstance(p, MegatronParameter):
                        p._debug_name = name
                        p.model_chunk = index  # the virtual-pipeline chunk: one libgtp chain each
            backend.context.reset_chains()

        def configure_gtp_remat_from_recipe(*, fp4=False, fp8_recipe=None, fp8=False, calculate_per_token_loss=False):
            """Before the build: libgtp's padding depends on the wire, not on the recipe; refuse what differs."""
            backend.recipe = {"fp4": fp4, "fp8_recipe": fp8_recipe, "fp8": fp8,
                              "calculate_per_token_loss": calculate_per_token_loss}
            check_recipe(backend.recipe, backend.context.sizes, backend.context.sum_grads)

        def gtp_remat_shard_dim0(dim0, gtp_remat_group):
            g = backend.context.geometry(dim0, 16, backend.wire, backend.group_name(gtp_remat_group))
            return g.shard_rows, g.padded_rows - g.rows

        def is_gtp_param(param):
            return bool(getattr(param, "is_gtp_weight_remat", False))

        def dequantize_gtp_native_fp8(param):
            raise TypeError(f"{type(param).__name__}: libgtp keeps BF16/FP32 shards (quantized wires are made from "
                            "them), there is no native-FP8 GTP parameter to dequantize")

        def gtp_native_fp8_load_context(module):
            del module
            return contextlib.nullcontext()

        def wait_for_gtp_grad_reduction_on_current_stream():
            """finalize_model_grads' fence: gradients not yet delivered are delivered now (drain)."""
            if backend.context._finalized or backend.context._ready or backend.context._deferred:
                backend.context.drain()

        def wait_async_comms(*args, **kwargs):
            del args, kwargs
            wait_for_gtp_grad_reduction_on_current_stream()

        def unsupported(*args, **kwargs):
            raise RuntimeError(_CUDA_GRAPHS)

        return {"GTPChain": mgtp.GTPChain, "GTPEmbeddingWeight": EmbeddingWeight,
                "attach_gtp_to_presharded_module": attach_gtp_to_presharded_module,
                "classify_gtp_remat_chains": classify_gtp_remat_chains,
                "configure_gtp_remat_from_recipe": configure_gtp_remat_from_recipe,
                "dequantize_gtp_native_fp8": dequantize_gtp_native_fp8, "get_ag_stream": unsupported,
                "get_rs_stream": unsupported, "gtp_native_fp8_load_context": gtp_native_fp8_load_context,
                "gtp_remat_shard_dim0": gtp_remat_shard_dim0, "is_gtp_param": is_gtp_param,
                "make_sharded_tensors_for_checkpoint_with_gtp_remat": checkpoint.make_sharded_tensors,
                "set_cuda_graph_mempool": unsupported, "wait_async_comms": wait_async_comms,
                "wait_for_gtp_grad_reduction_on_current_stream": wait_for_gtp_grad_reduction_on_current_stream,
                "wrap_module_params_gtp": wrap_module_params_gtp}


def _shard_passed_in(forward):
    """ColumnParallelLinear.forward that also takes a libgtp shard as `weight=`: GPTModel's tied output
    layer gets the embedding's weight so (and at PP > 1 the last stage its own). Megatron-Core 0.19
    checks a passed weight's shape against the TP-local (output_size_per_partition, input_size), which a
    GTP shard never has (its own GTP fails there too): the check is made here on the shard's full
    shape, and Megatron's then sees the shard's rows. The layer gathers and reduce-scatters the weight
    through the same calls as its own; a weight it does not own is marked `tied` (its uses summed, one
    reduce-scatter per backward pass). Any other weight, or none, goes to Megatron's forward unchanged."""
    def routed(self, input_, weight=None, runtime_gather_output=None):
        if not isinstance(weight, MegatronParameter):
            return forward(self, input_, weight, runtime_gather_output)
        expected = (self.output_size_per_partition, self.input_size)
        if tuple(weight.full_shape) != expected:
            raise RuntimeError(f"supplied weight's shape is {tuple(weight.full_shape)} (a libgtp shard of "
                               f"{tuple(weight.shape)}), not {expected} as expected: pass a weight of the layer's "
                               "full shape (a tied embedding's vocabulary and hidden sizes must be the output "
                               "layer's)")
        if weight is not self.weight:
            weight.tied = True
        self.output_size_per_partition = weight.shape[0]
        try:
            return forward(self, input_, weight, runtime_gather_output)
        finally:
            self.output_size_per_partition = expected[0]
    routed.__doc__ = forward.__doc__
    return routed


def check_recipe(recipe, sizes, sum_grads):
    """Refuses a recipe libgtp's context was not made for: calculate_per_token_loss must match the
    context's sum_grads wherever a GTP axis is active (Megatron sums that axis then, and means it otherwise)."""
    per_token = bool(recipe.get("calculate_per_token_loss"))
    if per_token != sum_grads and (sizes.gtp_remat > 1 or sizes.expert_gtp_remat > 1):
        raise RuntimeError(f"calculate_per_token_loss={per_token} but libgtp's context reduce-scatters the "
                           f"{'sum' if sum_grads else 'mean'} over G: Megatron sums the GTP axis under per-token "
                           "loss and averages it otherwise. Call configure_gtp_remat_from_recipe (or set "
                           "config.calculate_per_token_loss) before gtp.megatron.use_libgtp, or pass "
                           f"use_libgtp(sum_grads={per_token})")
    if recipe.get("fp4") or (recipe.get("fp8") and recipe.get("fp8_recipe") != "tensorwise"):
        name = "fp4" if recipe.get("fp4") else f"fp8_recipe={recipe.get('fp8_recipe')!r}"
        raise RuntimeError(f"{name}: libgtp's TE path refuses this recipe in LayerNormLinear / GroupedLinear "
                           "backward, which Megatron's GPT layers use (docs/python.md, recipe x wire table): use "
                           "fp8_recipe='tensorwise' (Float8CurrentScaling, --fp8-recipe tensorwise) or BF16")


def check_config(config, ddp_config=None):
    """What the libgtp backend does not run, refused before training with the fix."""
    if getattr(config, "cuda_graph_impl", "none") not in (None, "none") or getattr(config, "enable_cuda_graph", False):
        raise RuntimeError(_CUDA_GRAPHS)
    if getattr(config, "delay_wgrad_compute", False):
        raise RuntimeError("delay_wgrad_compute=True defers wgrads to TE's wgrad_store, which never finalizes a "
                           "distributed weight: train with delay_wgrad_compute=False")
    if getattr(config, "fp8_param", False) or getattr(config, "fp8_param_gather", False):
        raise RuntimeError("fp8_param_gather (FP8 primary weights) is not a libgtp shard: keep BF16/FP32 weights; "
                           "use gtp.megatron.use_libgtp(wire='fp8') to gather FP8")
    if ddp_config is not None and getattr(ddp_config, "use_megatron_fsdp", False):
        raise RuntimeError("Megatron FSDP shards the same weights libgtp shards: use DDP with "
                           "gtp.megatron.use_libgtp(), or FSDP without it")


def _subclasses(cls):
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


class _Missing:
    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()

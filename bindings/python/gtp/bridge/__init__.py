"""gtp.bridge: libgtp as the GTP backend of Megatron Bridge 0.6.2's pretrain (EXPERIMENTAL, as GTP is
upstream). See docs/bridge.md.

    import gtp.bridge
    gtp.bridge.apply_install_workarounds()           # before importing megatron.bridge (see install.py)
    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.training.gpt_step import forward_step
    cfg = gtp.bridge.recipe.tiny_gpt_config()         # or any Bridge ConfigContainer
    cfg.model.tensor_parallel_num_weight_shards = TP * G
    gtp.bridge.enable(cfg)                            # refuses here what cannot run
    pretrain(cfg, forward_step)                       # unmodified Bridge

G and EG reach initialize_model_parallel, libgtp is attached right after the process groups exist
(before the model is built), chains are classified by a post-wrap hook after every VPP chunk is built
and wrapped, and libgtp is reset when Bridge destroys its global state or initializes again. The data
loaders, consumed samples, FLOPs, evaluation counts, the logged loss and checkpoint replica ids / RNG
state count the DP x G data ranks, as Megatron-LM does."""
from .checks import check, sizes
from .hooks import BRIDGE_VERSION, CORE_VERSION, Hooks, data_view
from . import recipe
from .install import apply_install_workarounds

__all__ = ["enable", "disable", "enabled", "check", "sizes", "data_view", "model_parallel_kwargs",
           "apply_install_workarounds", "BRIDGE_VERSION", "CORE_VERSION"]


class _State:
    def __init__(self, cfg, libgtp_kwargs):
        self.cfg = cfg
        self.libgtp_kwargs = libgtp_kwargs
        self.sizes = None       # set when Bridge initializes the process groups
        self.hooks = Hooks(self)


_STATE = None


def enable(cfg, *, wire="bf16", **use_libgtp_kwargs):
    """Makes Megatron Bridge's pretrain(cfg, ...) train cfg with GTP on libgtp. Refuses now (RuntimeError /
    ValueError naming the fix) what cannot run; checks again when Bridge initializes. `wire` and the
    other keywords go to gtp.megatron.use_libgtp (backend, profile, prefetch_depth, ...). One config
    at a time: enable() again replaces it; disable() undoes everything."""
    global _STATE
    check(cfg)
    if _STATE is not None:
        disable()
    state = _State(cfg, {"wire": wire, **use_libgtp_kwargs})
    state.hooks.install()
    _register_post_wrap_hook(cfg.model, _classify_chains(state))
    _STATE = state
    return state


def disable():
    """Restores Bridge's functions and closes libgtp (gtp.megatron.reset)."""
    global _STATE
    from .. import megatron as gm
    state, _STATE = _STATE, None
    if state is not None:
        state.hooks.uninstall()
    gm.reset()


def enabled():
    return _STATE


def model_parallel_kwargs(provider):
    """For a provider's own initialize_model_parallel (outside pretrain):
    `provider.initialize_model_parallel(seed, **gtp.bridge.model_parallel_kwargs(provider))`."""
    from ..megatron import weight_shards_to_gtp
    etp = provider.expert_tensor_parallel_size or provider.tensor_model_parallel_size
    return {"gtp_remat_size": weight_shards_to_gtp(provider.tensor_model_parallel_size,
                                                   provider.tensor_parallel_num_weight_shards),
            "expert_gtp_remat_size": weight_shards_to_gtp(etp, provider.expert_tensor_parallel_num_weight_shards,
                                                          "expert_tensor_parallel_num_weight_shards",
                                                          "expert_tensor_parallel_size")}


def _classify_chains(state):
    def classify_gtp_chains(model):
        """Bridge post-wrap hook: every VPP chunk is built and DDP-wrapped; name libgtp's weights and
        start its chains (one per chunk), as Megatron-LM's setup_model_and_optimizer does."""
        if _STATE is not state:
            return model
        from megatron.core.tensor_parallel import gtp_api
        from .. import megatron as gm
        if gm.active() is None:
            raise RuntimeError("gtp.bridge: the model was built without libgtp attached (Bridge's process groups "
                               "were not initialized through pretrain/setup after gtp.bridge.enable)")
        m = state.cfg.model
        gtp_api.classify_gtp_remat_chains(model, cuda_graph_modules=getattr(m, "cuda_graph_modules", None),
                                          moe_shared_expert_overlap=getattr(m, "moe_shared_expert_overlap", False),
                                          cuda_graph_impl=getattr(m, "cuda_graph_impl", "none"))
        return model
    classify_gtp_chains._gtp_bridge_hook = True
    return classify_gtp_chains


def _register_post_wrap_hook(model_cfg, hook):
    """Bridge's public hook API (providers: register_post_wrap_hook; ModelConfig: post_wrap_hooks)."""
    if hasattr(model_cfg, "register_post_wrap_hook"):
        hooks = getattr(model_cfg, "_post_wrap_hooks", [])
        for old in [h for h in hooks if getattr(h, "_gtp_bridge_hook", False)]:
            hooks.remove(old)
        model_cfg.register_post_wrap_hook(hook)
    elif hasattr(model_cfg, "post_wrap_hooks"):
        model_cfg.post_wrap_hooks[:] = [h for h in model_cfg.post_wrap_hooks if not getattr(h, "_gtp_bridge_hook", False)]
        model_cfg.post_wrap_hooks.append(hook)
    else:
        raise TypeError(f"{type(model_cfg).__name__} has no post-wrap hooks: gtp.bridge needs a Bridge model provider "
                        "or ModelConfig")

"""What gtp.bridge refuses before training (each error names the setting and the fix), and the sizes
it derives, with Megatron-Core's own derivation (gtp.megatron.derive_sizes)."""
import os
from types import SimpleNamespace

from .. import megatron as gm
from ..megatron.backend import check_config, check_recipe


def world_size_from_env():
    """The world size as Bridge reads it before torch.distributed starts (torchrun / SLURM)."""
    import torch
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


def sizes(cfg, world_size=None):
    """Megatron-Core's sizes for this config: G, EG, the replicate DP and the DP x G data ranks."""
    m = cfg.model
    return gm.derive_sizes(world_size or world_size_from_env(), tp=m.tensor_model_parallel_size,
                           pp=m.pipeline_model_parallel_size, cp=m.context_parallel_size or 1,
                           ep=m.expert_model_parallel_size or 1, etp=m.expert_tensor_parallel_size,
                           num_weight_shards=m.tensor_parallel_num_weight_shards,
                           expert_num_weight_shards=m.expert_tensor_parallel_num_weight_shards)


def check(cfg, world_size=None):
    """Raises before training for what gtp.bridge (libgtp under Bridge 0.6.2) cannot run; returns the sizes."""
    from .install import applied, nvrx_async_supported
    s = sizes(cfg, world_size)
    gtp_on = s.gtp > 1 or s.expert_gtp > 1
    dist, ddp, ckpt = cfg.dist, cfg.ddp, cfg.checkpoint
    if getattr(dist, "use_decentralized_pg", False):
        raise RuntimeError("cfg.dist.use_decentralized_pg=True: Bridge 0.6.2 builds those groups with HyperCommGrid "
                           "over tp-cp-dp-pp only, with no gtp_remat axis, and libgtp reads megatron.core.parallel_state: "
                           "set cfg.dist.use_decentralized_pg=False")
    if getattr(getattr(cfg.model, "dist_train", None), "use_dist_train", False):
        raise RuntimeError("cfg.model.dist_train.use_dist_train=True builds per-module HyperCommGrids without GTP "
                           "axes: train without dist_train under gtp.bridge")
    if cfg.inprocess_restart is not None and getattr(cfg.inprocess_restart, "enabled", False):
        raise RuntimeError("cfg.inprocess_restart.enabled=True: an in-process restart destroys and rebuilds the "
                           "process groups under a live libgtp context: set cfg.inprocess_restart=None and restart "
                           "the job instead")
    if gtp_on and getattr(ddp, "average_in_collective", False):
        raise RuntimeError(f"cfg.ddp.average_in_collective=True at G={s.gtp}, EG={s.expert_gtp}: Megatron-Core's DDP "
                           "refuses it under GTP (the gradient mean over G is libgtp's): set cfg.ddp.average_in_collective=False")
    if getattr(ckpt, "ckpt_format", "torch_dist") != "torch_dist":
        raise RuntimeError(f"cfg.checkpoint.ckpt_format={ckpt.ckpt_format!r}: libgtp shards are saved through "
                           "Megatron-Core's sharded state dict only: set cfg.checkpoint.ckpt_format='torch_dist'")
    if getattr(ckpt, "async_save", False) and not nvrx_async_supported():
        raise RuntimeError("cfg.checkpoint.async_save=True needs nvidia-resiliency-ext >= 0.6.0 (Megatron-Core's async "
                           f"writer){'; its async package is hidden by apply_install_workarounds' if applied() else ''}: "
                           "set cfg.checkpoint.async_save=False")
    if getattr(dist, "use_megatron_fsdp", False) or getattr(dist, "use_torch_fsdp2", False):
        raise RuntimeError("cfg.dist.use_megatron_fsdp / use_torch_fsdp2: FSDP shards the weights libgtp shards: "
                           "use DDP (both False) with gtp.bridge")
    if getattr(dist, "use_tp_pp_dp_mapping", False):
        raise RuntimeError("cfg.dist.use_tp_pp_dp_mapping=True orders ranks tp-cp-ep-pp-dp; libgtp's grid follows "
                           "Megatron-Core's default tp-cp-ep-dp-pp: set cfg.dist.use_tp_pp_dp_mapping=False")
    if gtp_on and getattr(dist, "use_gloo_process_groups", False):
        raise RuntimeError(f"cfg.dist.use_gloo_process_groups=True at G={s.gtp}: Megatron-Core builds no Gloo groups "
                           "under GTP and Bridge's optimizer would ask for them: set cfg.dist.use_gloo_process_groups=False")
    if gtp_on and getattr(ddp, "num_distributed_optimizer_instances", 1) != 1:
        raise RuntimeError("cfg.ddp.num_distributed_optimizer_instances must be 1 under GTP (Megatron-Core asserts it): "
                           "set it to 1")
    check_config(cfg.model, ddp)
    m = cfg.model
    if gtp_on and getattr(m, "calculate_per_token_loss", False):
        raise RuntimeError(f"cfg.model.calculate_per_token_loss=True at G={s.gtp}: libgtp sums the G axis for it "
                           "(gtp.megatron), but Bridge's token counting over DP x G is not verified with gtp.bridge: "
                           "set cfg.model.calculate_per_token_loss=False")
    check_recipe({"calculate_per_token_loss": getattr(m, "calculate_per_token_loss", False), "fp8": getattr(m, "fp8", None),
                  "fp8_recipe": getattr(m, "fp8_recipe", None), "fp4": getattr(m, "fp4", None)},
                 SimpleNamespace(gtp_remat=s.gtp, expert_gtp_remat=s.expert_gtp), sum_grads=False)
    return s

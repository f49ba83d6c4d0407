"""The GPU side of the head-to-head (bench/megatron/head_to_head.py): one variant's model built and
trained by one implementation on this rank, as megatron.training builds and trains it (TP defaults,
Float16Module, DDP per model chunk on a side stream, the distributed optimizer, finalize_model_grads,
Megatron-Core's pipeline schedules: interleaved with virtual chunks), its parameters as the global rows
each rank holds, and torch_dist checkpoints of model and distributed optimizer."""
import os

import h2h_compare
import h2h_plan
from megatron_bench import OPTIMIZER_CKPT_METADATA, forward_step  # beside this file


class Refused(Exception):
    """libgtp refused the configuration before training (its message says what and the fix)."""


def init_parallel(layout):
    from megatron.core import parallel_state as ps
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(**layout, create_gloo_process_groups=False)


def batch(step, data_index, mb):
    import torch
    g = torch.Generator().manual_seed(100000 * step + 1000 * data_index + mb)
    tokens = torch.randint(0, h2h_plan.VOCAB, (h2h_plan.MICRO, h2h_plan.SEQ + 1), generator=g)
    return {"tokens": tokens[:, :-1].cuda(), "labels": tokens[:, 1:].cuda()}


def _check_expert_groups(context):
    """libgtp's expert GTP rank must be this rank's place in Megatron's expert GTP group (gtp.megatron
    checks the dense and TP groups itself)."""
    import torch
    from megatron.core import parallel_state as ps
    group = ps.get_expert_gtp_weight_remat_group(check_initialized=False)
    if group is None or group.size() <= 1:
        return None
    members = torch.distributed.get_process_group_ranks(group)
    mine = members.index(torch.distributed.get_rank())
    if context.sizes.expert_gtp_remat_rank != mine:
        raise RuntimeError(f"libgtp's expert GTP rank {context.sizes.expert_gtp_remat_rank} is not this rank's place "
                           f"{mine} in Megatron's expert GTP group {members}")
    return members


def build(variant, world, impl, seed, reference=None):
    """Model chunks (DDP-wrapped), optimizer, config, checks and the initial parameters (snapshot).
    With `reference` (GTP off's initial snapshot), Megatron's GTP shards get its rows before the
    optimizer copies them, and libgtp's are checked to hold them already. Raises Refused where libgtp
    refuses: an error raised from libgtp's Python package (gtp/) while the libgtp model is built."""
    try:
        return _build(variant, world, impl, seed, reference)
    except Refused:
        raise
    except Exception as error:
        if impl == "libgtp" and _raised_by_gtp(error):
            import gtp.megatron as gm
            try:
                gm.reset()
            except Exception:  # noqa: BLE001 - the refusal is what is reported
                pass
            raise Refused(f"{type(error).__name__}: {error}") from error
        raise


def _raised_by_gtp(error):
    import traceback
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}gtp{os.sep}" in frames[-1].filename


def _build(variant, world, impl, seed, reference):
    import torch
    import gtp.megatron as gm
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import gtp_api
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    config = h2h_plan.transformer_config(variant, world, impl)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                               use_distributed_optimizer=True, bucket_size=4_000_000,
                                               check_for_nan_in_grad=True)
    gm.reset()
    checks = {}
    if impl == "libgtp":
        context = gm.use_libgtp(wire="bf16")
        gm.check_training(config, ddp_config)
        checks["expert_gtp_group"] = _check_expert_groups(context)
    if impl != "off":
        gtp_api.configure_gtp_remat_from_recipe(fp8=bool(config.fp8), fp8_recipe=config.fp8_recipe)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    spec = get_gpt_layer_with_transformer_engine_spec(num_experts=config.num_moe_experts,
                                                      moe_grouped_gemm=bool(config.num_moe_experts))
    chunks = []
    for vp in range(h2h_plan.chunks(variant)):
        vp_stage = vp if variant.vpp else None
        chunk = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=h2h_plan.VOCAB,
                         max_sequence_length=h2h_plan.SEQ, vp_stage=vp_stage,
                         pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                         post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage))
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunk.cuda(torch.cuda.current_device())
        if variant.fused:
            for module in chunk.modules():
                if hasattr(module, "fuse_wgrad_accumulation"):
                    module.fuse_wgrad_accumulation = True
        chunks.append(Float16Module(config, chunk))
    model = []
    for vp, chunk in enumerate(chunks):
        ddp_stream = torch.cuda.Stream()
        ddp_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(ddp_stream):  # as megatron.training: bucketing on the first chunk only
            model.append(DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                                 disable_bucketing=vp > 0))
        torch.cuda.current_stream().wait_stream(ddp_stream)
    if impl != "off":
        gtp_api.classify_gtp_remat_chains(model)
    if reference is not None and impl == "megatron":  # its RNG tracker drew other values
        checks["initial_rows_set_from_off"] = set_rows_from(model, reference)
    initial = snapshot(model)
    if reference is not None and impl == "libgtp":  # built full with GTP off's initialization: the same rows
        d = h2h_compare.param_distances(initial, reference)
        checks["libgtp_initial_rows_equal_off"] = len(d) == len(initial) and all(x == 0.0 for x in d.values())
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.01, bf16=True,
                                                       params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                                                       clip_grad=1.0), model, use_gloo_process_groups=False)
    config.finalize_model_grads_func = finalize_model_grads
    no_sync = [m.no_sync for m in model]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    config.grad_scale_func = optimizer.scale_loss
    if impl == "libgtp":
        checks["libgtp_weights"] = sum(isinstance(p, gm.MegatronParameter) for m in model for p in m.parameters())
    return model, optimizer, config, checks, initial


def held_rows(param):
    """(first global row of the TP-local weight, rows held without padding) of a parameter: a libgtp
    shard, a Megatron-Core GTP shard, or a whole parameter."""
    import torch
    geometry = getattr(param, "geometry", None)
    if geometry is not None and hasattr(param, "gtp_weight"):  # libgtp keeps its padding out of the shard
        return geometry.row_start, geometry.valid_rows
    if getattr(param, "is_gtp_weight_remat", False) and getattr(param, "group", None) is not None:
        rows = param.shape[0]
        start = torch.distributed.get_rank(param.group) * rows
        full = rows * param.group.size() - getattr(param, "pad_length", 0)  # Megatron pads the last ranks
        return start, max(0, min(rows, full - start))
    return 0, param.shape[0] if param.dim() else 1


def snapshot(model):
    """{chunk.name: (first global row, the rows held as FP32 on the CPU)} of every parameter."""
    out = {}
    for index, chunk in enumerate(model):
        for name, p in chunk.named_parameters():
            start, rows = held_rows(p)
            t = p.detach().float().cpu()
            out[f"{index}.{name}"] = (start, t[:rows].clone() if t.dim() else t.reshape(1).clone())
    return out


def set_rows_from(model, reference):
    """Every parameter gets the values of the same rows in `reference` (a snapshot of the GTP-off
    model): Megatron's GTP draws its shards' initial values from its own RNG tracker."""
    import torch
    changed = 0
    with torch.no_grad():
        for index, chunk in enumerate(model):
            for name, p in chunk.named_parameters():
                start, rows = held_rows(p)
                ref_start, ref = reference[f"{index}.{name}"]
                source = ref[start - ref_start:start - ref_start + rows]
                if p.dim() == 0:
                    p.copy_(source.reshape(()))
                else:
                    p[:rows].copy_(source.to(p.device, p.dtype))
                changed += 1
    return changed


def train(model, optimizer, config, variant, world, steps, first_step=0):
    """Steps of Megatron-Core's schedule and optimizer; per step the loss (on the stage with it), the
    grad norm and NCCL's operations (from this rank's NCCL log, when GTP_H2H_NCCL_LOG names it)."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func
    rank = torch.distributed.get_rank()
    data_index = h2h_plan.data_index(rank, variant, world)
    fwd_bwd = get_forward_backward_func()
    log = os.environ.get("GTP_H2H_NCCL_LOG")
    position = os.path.getsize(log) if log and os.path.exists(log) else 0
    losses, norms, per_step_ops = [], [], []
    for step in range(first_step, first_step + steps):
        for m in model:
            m.zero_grad_buffer()
        optimizer.zero_grad()
        micro = [batch(step, data_index, mb) for mb in range(h2h_plan.MICROBATCHES)]
        data = [iter(micro) for _ in model] if variant.vpp else iter(micro)
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=model if variant.vpp else model[0],
                      num_microbatches=h2h_plan.MICROBATCHES, seq_length=h2h_plan.SEQ,
                      micro_batch_size=h2h_plan.MICRO, forward_only=False)
        ok, norm, _ = optimizer.step()
        torch.cuda.synchronize()
        if not ok:
            raise RuntimeError(f"step {step}: the optimizer skipped the update")
        if out:  # the last pipeline stage
            losses.append(sum(float(o["lm loss"]) for o in out) / len(out))
        norms.append(float(norm))
        if log and os.path.exists(log):
            with open(log, "rb") as f:
                f.seek(position)
                text = f.read()
            position += len(text)
            per_step_ops.append(h2h_compare.parse_nccl(text.decode(errors="replace")))
    return losses, norms, per_step_ops


def release(model, optimizer, config):
    import torch
    import gtp.megatron as gm
    config.finalize_model_grads_func = config.no_sync_func = config.grad_scale_func = None
    gm.reset()
    del model, optimizer
    torch.cuda.empty_cache()


def sharded_state(model, optimizer, loading):
    """Model and distributed optimizer as megatron.training's checkpointing describes them (one chunk:
    the checkpoint case trains h2h_plan.CKPT_VARIANT, without virtual pipeline chunks)."""
    from megatron.core.utils import unwrap_model
    if len(model) != 1:
        raise ValueError(f"{len(model)} model chunks: the checkpoint case saves one (h2h_plan.CKPT_VARIANT)")
    model_sd = unwrap_model(model[0]).sharded_state_dict()
    return {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=loading,
                                                                         metadata=OPTIMIZER_CKPT_METADATA)}


def save(model, optimizer, folder):
    from megatron.core import dist_checkpointing
    os.makedirs(folder, exist_ok=True)
    dist_checkpointing.save(sharded_state(model, optimizer, loading=False), folder)


def load(model, optimizer, folder):
    """Loads the checkpoint into the model (libgtp re-packs its shards on load_state_dict) and optimizer."""
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model
    state = dist_checkpointing.load(sharded_state(model, optimizer, loading=True), folder)
    unwrap_model(model[0]).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])

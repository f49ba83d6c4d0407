"""Megatron-Core 0.19.2's own GTP forced to run its machinery at G = 1: a benchmark aid (issue 41
part 2), never imported by libgtp's library code.

Megatron's GTP is inert in a group of one twice over:
1. its TE layers never attach (extensions/transformer_engine.py, _init_gtp_remat_context, returns
   at gtp_remat_group.size() <= 1), so the weights stay plain parameters;
2. TE's gather_along_first_dim / reduce_scatter_along_first_dim, which Megatron's GTP calls with an
   output buffer from its GTPWeightCache, return their INPUT at world size 1 without writing that
   buffer: Megatron's prefetched path (every weight but a chain head) then reads a cache buffer no
   collective wrote, and its async reduce-scatter adds one into main_grad.
force_machinery_at_g1() replaces, inside Megatron's GTP module only (the names it imported from TE),
those two functions by ones that at world size 1 run the collective TE runs at world size > 1
(torch.distributed all_gather_into_tensor / reduce_scatter_tensor, NCCL over the size-1 group) into
the buffer Megatron passes; at world size > 1 they are TE's own. attach_te_stack() attaches Megatron's
GTP to plain te.Linear layers as _init_gtp_remat_context does at size > 1 (the weight already is the
whole shard at G = 1); attaching_at_g1() makes Megatron's own TE layers (GPTModel's) attach in a group
of one while it is entered. The benchmarks that use them check that the losses and main grads equal GTP
off's (te_stack_bench: "parity")."""
import contextlib

import torch

from megatron.core.extensions import transformer_engine as mte
from megatron.core.tensor_parallel import generalized_tensor_parallelism as mgtp

_TE_GATHER = mgtp.gather_along_first_dim
_TE_REDUCE_SCATTER = mgtp.reduce_scatter_along_first_dim


def _gather_written_at_g1(inp, process_group, async_op=False, quantizer=None, output_tensor=None,
                          external_coalescing=False):
    """TE's gather_along_first_dim, but a group of one runs the all-gather into output_tensor (TE's
    plain-tensor path at world size > 1) instead of returning the input."""
    if torch.distributed.get_world_size(process_group) != 1:
        return _TE_GATHER(inp, process_group, async_op=async_op, quantizer=quantizer, output_tensor=output_tensor,
                          external_coalescing=external_coalescing)
    if quantizer is not None:
        raise NotImplementedError("megatron_gtp_g1 forces Megatron's BF16 GTP shards only (no quantizer): build the "
                                  "layers without fp8_model_init / --fp8-param-gather")
    if output_tensor is None:
        output_tensor = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device, memory_format=torch.contiguous_format)
    handle = torch.distributed.all_gather_into_tensor(output_tensor, inp.contiguous(), group=process_group,
                                                      async_op=async_op)
    return output_tensor, handle


def _reduce_scatter_written_at_g1(inp, tp_group, async_op=False, output=None):
    """TE's reduce_scatter_along_first_dim, but a group of one runs the reduce-scatter into `output`."""
    if torch.distributed.get_world_size(tp_group) != 1:
        return _TE_REDUCE_SCATTER(inp, tp_group, async_op=async_op, output=output)
    if output is None:
        output = torch.empty(inp.shape, dtype=inp.dtype, device=inp.device)
    handle = torch.distributed.reduce_scatter_tensor(output, inp.contiguous(), group=tp_group, async_op=async_op)
    return output, handle


def force_machinery_at_g1():
    """Installs the two replacements in Megatron's GTP module (idempotent; for this process)."""
    mgtp.gather_along_first_dim = _gather_written_at_g1
    mgtp.reduce_scatter_along_first_dim = _reduce_scatter_written_at_g1


@contextlib.contextmanager
def _attach_in_any_group(module, output_size, gtp_remat_group, extra_kwargs, *, is_expert=False, is_grouped=False,
                         rng_via_kwarg=True, out_split_size=1):
    """Megatron's _init_gtp_remat_context, attaching in a group of one too. Its _gtp_pre_init is left
    out: at G = 1 the shard is the whole weight (no padding: refused otherwise), and the weight is
    initialized from GTP off's RNG stream instead of the GTP one, so the model starts where GTP off's does."""
    del extra_kwargs, is_expert, rng_via_kwarg  # only _gtp_pre_init reads them
    if gtp_remat_group is None:
        yield output_size
        return
    if gtp_remat_group.size() != 1:
        raise RuntimeError(f"attaching_at_g1 builds models at G = 1; this group has {gtp_remat_group.size()} ranks")
    _, pad = mgtp.gtp_remat_shard_dim0(output_size // out_split_size, gtp_remat_group)
    if pad:
        raise ValueError(f"{type(module).__name__}: {output_size} output rows would be padded by {pad} at G = 1; "
                         f"use sizes that are multiples of GTP_CONFIG.pad_for_alignment ({mgtp.GTP_CONFIG.pad_for_alignment})")
    yield output_size
    mte._gtp_attach_post_init(module, (gtp_remat_group, 0, output_size), is_grouped=is_grouped)


@contextlib.contextmanager
def attaching_at_g1():
    """While entered, Megatron's TE layers attach its GTP in a group of one (build the model inside)."""
    force_machinery_at_g1()
    original = mte._init_gtp_remat_context
    mte._init_gtp_remat_context = _attach_in_any_group
    try:
        yield
    finally:
        mte._init_gtp_remat_context = original


def reset():
    """Forgets every Megatron GTP weight of this process: chains, the buffer cache, the wgrad pool (so a
    stack built after starts its own chain and its memory is its own)."""
    mgtp.reset_gtp_state()
    mgtp._GTP_PARAMS.clear()
    mgtp._inflight_comm_params.clear()
    mgtp.get_global_GTP_cache().clear()
    mgtp._wgrad_buf_pool.clear()


def attach_te_stack(stack, group):
    """Puts every te.Linear of `stack` on Megatron's GTP over `group` (of size 1 here), keeping each
    weight's main_grad (Megatron's attach makes a new parameter). Returns the GTP weights in order."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size(group) != 1:
        raise RuntimeError("attach_te_stack forces Megatron's GTP at G = 1: give it a torch.distributed group of one rank")
    force_machinery_at_g1()
    reset()
    weights = []
    for index, layer in enumerate(stack):
        main_grad = layer.weight.main_grad
        _, pad = mgtp.gtp_remat_shard_dim0(layer.weight.shape[0], group)
        mgtp.attach_gtp_to_presharded_module(layer, group, pad)
        layer.weight.main_grad = main_grad
        layer.weight._debug_name = f"{index}.weight"
        weights.append(layer.weight)
    return weights


def cache_bytes():
    """Bytes Megatron's GTP holds beyond the model: its gather / reduce-scatter cache and wgrad pool."""
    pool = sum(b.numel() * b.element_size() for bufs in mgtp._wgrad_buf_pool.values() for b in bufs)
    return int(mgtp.get_global_GTP_cache()._total_bytes) + pool

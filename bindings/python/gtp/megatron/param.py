"""MegatronParameter: a gtp.torch ShardedParameter that also answers to the names Megatron-Core's own
code calls on a GTP weight (DDP's register_grad_accum_hook, the column-parallel linear's and
embedding's all_gather_and_prefetch / wgrad_reduce_scatter, the is_gtp_weight_remat tag, .group for
checkpoint offsets). The work is libgtp's; these are adapters."""
import torch

from ..torch.parameter import ShardedParameter


class MegatronParameter(ShardedParameter):
    """A libgtp shard Megatron-Core treats as one of its GTP weights.

    Gradients reach DDP as gtp.torch delivers them: at the context's drain (the end of each backward
    pass), after libgtp's reduce-scatter add has landed, into the `main_grad` DDP assigned (a bucket
    view, FP32 or BF16) or into `.grad`; then DDP's hook runs (register_grad_accum_hook), so its
    overlapped bucket reduction starts only on delivered gradients."""

    is_gtp_weight_remat = True  # Megatron's tag: DDP, the optimizer, norms and checkpoints key on it

    def __new__(cls, *args, **kwargs):
        param = super().__new__(cls, *args, **kwargs)
        param.group = None          # Megatron's process group of the weight's GTP axis (set by the backend)
        param.gtp_remat_size = param.context.group_size(param.gtp_weight.group)
        param.pad_length = 0        # libgtp keeps its padding out of the shard
        param._debug_name = param.gtp_weight.name
        param.chain_id = "GTP_ungraphed"
        # Also used by a layer that does not own it (the tied output layer, weight=...; set at that
        # forward): its consumers' wgrads are summed in one grad buffer, reduce-scattered once at drain.
        param.tied = False
        return param

    def reduce_wgrad(self, wgrad):
        """One consumer's wgrad to libgtp; delivered at drain. A tied weight's uses are summed first."""
        return self.add_group_grads(wgrad) if self.tied else self.finalize_group_grads(wgrad)

    # -- Megatron DDP --
    def register_grad_accum_hook(self, grad_accum_node, hook):
        """DDP's post-hook for this weight, run once its gradient is delivered (at drain)."""
        del grad_accum_node
        self.register_grad_ready_hook(lambda _param: hook())

    # -- Megatron's own layers (ColumnParallelLinear, VocabParallelEmbedding at G > 1) --
    def all_gather_and_prefetch(self, fwd=True, nvtx_label=None):
        del nvtx_label
        return self.materialize_group_for_forward() if fwd else self.materialize_group_for_backward()

    def all_gather_and_prefetch_bwd(self, nvtx_label=None):
        del nvtx_label
        return self.materialize_group_for_backward()

    def batched_all_gather_and_prefetch(self, **kwargs):
        return self.all_gather_and_prefetch(**kwargs)

    def wgrad_reduce_scatter(self, wgrad, nvtx_label=None):
        """Megatron's call: the gradient goes to libgtp and is delivered at drain; autograd gets None."""
        del nvtx_label
        return self.reduce_wgrad(wgrad)

    def batched_wgrad_reduce_scatter(self, wgrad_list, nvtx_label=None):
        return self.wgrad_reduce_scatter(wgrad_list, nvtx_label)

    def get_padded_shard(self):
        return self

    @property
    def _unsharded_shape(self):
        return tuple(self.full_shape)


class EmbeddingWeight(torch.autograd.Function):
    """Megatron's GTPEmbeddingWeight on libgtp: the full table for the lookup in forward; its
    gradient to libgtp's reduce-scatter in backward (delivered at drain, so autograd gets None)."""

    @staticmethod
    def forward(ctx, weight):
        ctx.weight = weight
        return weight.materialize_group_for_forward().detach()

    @staticmethod
    def backward(ctx, grad_output):
        weight, ctx.weight = ctx.weight, None
        weight.reduce_wgrad(grad_output.float())
        return None

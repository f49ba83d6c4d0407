"""gtp.torch.GroupedLinear: MoE experts as one libgtp expert group (TE's GroupedLinear shape).

Every expert's weight is a ShardedParameter; the first is the group's leader, so one materialize call
gathers all experts (one collective, one cache slot) and one finalize reduces all their gradients,
which is what a grouped GEMM needs. The arithmetic per expert is gtp.torch.Linear's (BF16 weight)."""
import math

import torch

from .linear import _gemm, _store_wgrad, _wgrad
from .parameter import ShardedParameter


def _as_list(materialized):
    return materialized if isinstance(materialized, list) else [materialized]  # one expert: a bare tensor


class _ShardedGroupedFunction(torch.autograd.Function):
    """forward: one group materialize -> a GEMM per expert -> release. backward: one group materialize
    -> dgrad per expert -> release; each expert's wgrad written (or added) into its grad buffer -> one finalize."""

    @staticmethod
    def forward(ctx, x, m_splits, *weights):
        leader = weights[0]
        fulls = _as_list(leader.materialize_group_for_forward())
        try:
            out = torch.cat([_gemm(chunk, full) for chunk, full in zip(x.split(m_splits), fulls)])
        finally:
            leader.release_group()
        ctx.save_for_backward(x)
        ctx.m_splits, ctx.weights = m_splits, weights
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        leader = ctx.weights[0]
        grads = grad_out.split(ctx.m_splits)
        grad_in = None
        # Materialized even without dgrad (as gtp.torch.Linear) so the backward chain is the same every step.
        fulls = _as_list(leader.materialize_group_for_backward())
        try:
            if ctx.needs_input_grad[0]:
                grad_in = torch.cat([g.matmul(full.to(g.dtype)) for g, full in zip(grads, fulls)])
        finally:
            leader.release_group()
        for weight, g, chunk in zip(ctx.weights, grads, x.split(ctx.m_splits)):
            _store_wgrad(weight, g, chunk)
        leader.finalize_group_grads()  # drains at the end of backward
        return (grad_in, None) + (None,) * len(ctx.weights)


class _PlainGroupedFunction(torch.autograd.Function):
    """The same arithmetic on unsharded weights (GTP off)."""

    @staticmethod
    def forward(ctx, x, m_splits, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.m_splits = m_splits
        return torch.cat([_gemm(chunk, w.to(torch.bfloat16)) for chunk, w in zip(x.split(m_splits), weights)])

    @staticmethod
    def backward(ctx, grad_out):
        x, *weights = ctx.saved_tensors
        grads, chunks = grad_out.split(ctx.m_splits), x.split(ctx.m_splits)
        grad_in = torch.cat([g.matmul(w.to(torch.bfloat16).to(g.dtype)) for g, w in zip(grads, weights)]) \
            if ctx.needs_input_grad[0] else None
        return (grad_in, None) + tuple(_wgrad(g, c).to(w.dtype) for g, c, w in zip(grads, chunks, weights))


class GroupedLinear(torch.nn.Module):
    """num_gemms experts, each y_i = x_i W_i^T + b_i with W_i of out_features x in_features; forward(x,
    m_splits) runs expert i on the next m_splits[i] rows of x (tokens already sorted by expert).

    context: a gtp.torch.Context to shard every W_i over `group` ("expert_gtp_remat": the EG ranks of
    the expert view; "gtp_remat" also works) as one expert group, or None (GTP off); in a group of one
    the experts stay plain parameters unless the context has machinery_at_g1=True. Expert tensor
    parallelism is not applied (each rank holds whole experts' rows). Weights are named weight0.. as
    in TE; each is drawn from torch's generator in order, so equal seeds give equal experts on and off.
    """

    def __init__(self, num_gemms, in_features, out_features, bias=True, *, context=None, wire="bf16",
                 group="expert_gtp_remat", name=None, dtype=torch.float32, device=None, nvfp4_2d=False,
                 mx_rounding="rceil", gemm_scales="row_major"):
        super().__init__()
        if num_gemms <= 0:
            raise ValueError(f"num_gemms={num_gemms}; a GroupedLinear needs at least one expert")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.context, self.wire, self.group = context, wire, group
        device = context.device if context is not None else device
        g = context.geometry(out_features, in_features, wire, group) if context is not None else None  # checks the wire
        shard = context is not None and context.uses_libgtp(group)
        name = name or (f"grouped{len(context.parameters)}" if shard else None)
        leader = None
        for i in range(num_gemms):
            full = torch.empty(out_features, in_features, dtype=dtype)
            torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5))
            if not shard:
                weight = torch.nn.Parameter(full.to(device))
            else:
                weight = ShardedParameter(full[g.row_start:g.row_start + g.valid_rows].contiguous(), context,
                                          f"{name}.weight{i}", out_features, in_features, wire, group, leader,
                                          nvfp4_2d=nvfp4_2d, mx_rounding=mx_rounding, gemm_scales=gemm_scales)
                leader = weight if leader is None else leader
            self.register_parameter(f"weight{i}", weight)
        if shard:
            context.shard_updated([leader])  # collective: the leader stands for the group
        for i in range(num_gemms):
            if bias:
                bound = 1 / math.sqrt(in_features)
                self.register_parameter(f"bias{i}", torch.nn.Parameter(
                    torch.empty(out_features, dtype=dtype).uniform_(-bound, bound).to(device)))
            else:
                self.register_parameter(f"bias{i}", None)

    @property
    def sharded(self):
        return isinstance(self.weight0, ShardedParameter)

    def weights(self):
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    def forward(self, x, m_splits):
        m_splits = [int(m) for m in m_splits]
        if len(m_splits) != self.num_gemms or sum(m_splits) != x.shape[0] or min(m_splits) < 0:
            raise ValueError(f"m_splits={m_splits} must hold {self.num_gemms} non-negative counts summing to the "
                             f"{x.shape[0]} rows of x (tokens sorted by expert)")
        function = _ShardedGroupedFunction if self.sharded else _PlainGroupedFunction
        out = function.apply(x, m_splits, *self.weights())
        if self.bias0 is None:
            return out
        biases = [getattr(self, f"bias{i}").expand(m, -1) for i, m in enumerate(m_splits)]
        return out + torch.cat(biases)

    def extra_repr(self):
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias0 is not None}, gtp={self._gtp_repr()}")

    def _gtp_repr(self):
        if self.sharded:
            return f"wire={self.wire}, group={self.group}"
        return "off" if self.context is None else "inert (G = 1)"

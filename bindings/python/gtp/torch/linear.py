"""gtp.torch.Linear: a linear layer whose weight is GTP-sharded (context given) or plain (context None).

Both paths compute with the BF16 weight (BF16 mixed precision over an FP32 master): the sharded path
receives it from the wire, the plain path casts it. So GTP off and GTP on with the BF16 wire run the
same arithmetic, which is what the parity tests compare."""
import math

import torch

from .parameter import ShardedParameter


def _gemm(x, weight_bf16):
    return x.matmul(weight_bf16.to(x.dtype).t())


def _wgrad_operands(grad_out, x):
    return grad_out.reshape(-1, grad_out.shape[-1]).t().float(), x.reshape(-1, x.shape[-1]).float()


def _wgrad(grad_out, x):
    a, b = _wgrad_operands(grad_out, x)
    return a.matmul(b)


def _store_wgrad(weight, grad_out, x):
    """The wgrad into the weight's grad buffer: written by the GEMM when the buffer is new this step (no
    zero-fill, as a GEMM with beta = 0), added to what earlier microbatches left otherwise."""
    buffer, overwrite = weight.wgrad_buffer()
    a, b = _wgrad_operands(grad_out, x)
    if overwrite:
        torch.mm(a, b, out=buffer)
    else:
        buffer.add_(a.matmul(b))


class _ShardedLinearFunction(torch.autograd.Function):
    """forward: materialize -> GEMM -> release. backward: materialize for backward -> dgrad -> release;
    wgrad written (or added) into the grad buffer -> finalize (reduce-scatter into main_grad, drain at the end)."""

    @staticmethod
    def forward(ctx, x, weight):
        full = weight.materialize_group_for_forward()
        try:
            out = _gemm(x, full)
        finally:
            weight.release_group()
        ctx.save_for_backward(x)
        ctx.weight = weight
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        grad_in = None
        # Materialized even without dgrad, as TE does, so the backward chain stays the same every step.
        full = weight.materialize_group_for_backward()
        try:
            if ctx.needs_input_grad[0]:
                grad_in = grad_out.matmul(full.to(grad_out.dtype))
        finally:
            weight.release_group()
        _store_wgrad(weight, grad_out, x)
        weight.finalize_group_grads()  # drains at the end of backward
        return grad_in, None  # the shard's gradient arrives in main_grad, then .grad at drain


class _PlainLinearFunction(torch.autograd.Function):
    """The same arithmetic on an unsharded weight (GTP off)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return _gemm(x, weight.to(torch.bfloat16))

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_in = grad_out.matmul(weight.to(torch.bfloat16).to(grad_out.dtype)) if ctx.needs_input_grad[0] else None
        return grad_in, _wgrad(grad_out, x).to(weight.dtype)


class Linear(torch.nn.Module):
    """y = x W^T + b with W of out_features x in_features.

    context: a gtp.torch.Context to shard W over its gtp_remat group (G ranks), or None (GTP off). In a
    group of one W stays a plain parameter unless the context has machinery_at_g1=True: the layer is
    then GTP off exactly (the wire is not applied), as Megatron-Core's GTP is inert at size 1.
    parallel_mode: "column" (W's rows split over TP, output is this TP rank's slice) or "row" (W's
    columns split over TP, the partial outputs are summed over `tp_group`). TP comes from the context;
    TP = 1 is a plain linear either way.
    The initial full weight is drawn from torch's generator on every rank (same seed: same weight),
    so a GTP-on model starts from the weights of the GTP-off model built with the same seed.
    """

    def __init__(self, in_features, out_features, bias=True, *, context=None, wire="bf16", parallel_mode="column",
                 tp_group=None, name=None, dtype=torch.float32, device=None, nvfp4_2d=False, mx_rounding="rceil",
                 gemm_scales="row_major"):
        super().__init__()
        if parallel_mode not in ("column", "row"):
            raise ValueError(f"parallel_mode={parallel_mode!r}; use 'column' or 'row'")
        self.in_features, self.out_features = in_features, out_features
        self.context, self.wire, self.parallel_mode, self.tp_group = context, wire, parallel_mode, tp_group
        tp = context.sizes.tp if context is not None else 1
        tp_rank = context.rank % tp if context is not None else 0  # tp varies fastest in the grid
        if tp > 1 and tp_group is None:
            raise ValueError(f"a {parallel_mode}-parallel Linear with TP={tp} needs tp_group (the torch.distributed "
                             "group of this rank's TP peers) to sum its partial outputs (row) or input grads (column)")
        split = out_features if parallel_mode == "column" else in_features
        if split % tp != 0:
            raise ValueError(f"{parallel_mode}-parallel: {split} features do not divide over TP={tp}")
        self.tp, self.tp_rank = tp, tp_rank
        rows = out_features // tp if parallel_mode == "column" else out_features
        cols = in_features // tp if parallel_mode == "row" else in_features
        # Full weight first (nn.Linear's init), then this rank's TP slice, then its GTP rows.
        full = torch.empty(out_features, in_features, dtype=dtype)
        torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        local = full[tp_rank * rows:(tp_rank + 1) * rows] if parallel_mode == "column" else \
            full[:, tp_rank * cols:(tp_rank + 1) * cols]
        device = context.device if context is not None else device
        g = context.geometry(rows, cols, wire) if context is not None else None  # checks the wire at every G
        if context is None or not context.uses_libgtp("gtp_remat"):
            self.weight = torch.nn.Parameter(local.contiguous().to(device))
        else:
            name = name or f"linear{len(context.parameters)}"
            self.weight = ShardedParameter(local[g.row_start:g.row_start + g.valid_rows].contiguous(), context, name,
                                           rows, cols, wire, nvfp4_2d=nvfp4_2d, mx_rounding=mx_rounding,
                                           gemm_scales=gemm_scales)
            context.shard_updated([self.weight])  # collective: every rank builds the same layers in one order
        if bias:
            bound = 1 / math.sqrt(in_features)
            full_bias = torch.empty(out_features, dtype=dtype).uniform_(-bound, bound)
            local_bias = full_bias[tp_rank * rows:(tp_rank + 1) * rows] if parallel_mode == "column" else full_bias
            self.bias = torch.nn.Parameter(local_bias.contiguous().to(device))
        else:
            self.register_parameter("bias", None)

    @property
    def sharded(self):
        return isinstance(self.weight, ShardedParameter)

    def forward(self, x):
        function = _ShardedLinearFunction if self.sharded else _PlainLinearFunction
        if self.parallel_mode == "column" and self.tp > 1:
            x = _CopyToTensorParallel.apply(x, self.tp_group)
        out = function.apply(x, self.weight)
        if self.parallel_mode == "row" and self.tp > 1:
            out = _AllReduce.apply(out, self.tp_group)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"gtp={self._gtp_repr()}, parallel_mode={self.parallel_mode}, tp={self.tp}")

    def _gtp_repr(self):
        if self.sharded:
            return "wire=" + self.wire
        return "off" if self.context is None else "inert (G = 1)"

    # -- checkpoints: shards carry their offsets; a full weight is re-sharded on load --
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.sharded:
            g = self.weight.geometry
            destination[prefix + "weight"] = self.weight.detach().clone().cpu()
            destination[prefix + "weight_gtp_shard"] = torch.tensor(
                [g.row_start, g.valid_rows, g.rows, g.cols], dtype=torch.int64)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key, meta_key = prefix + "weight", prefix + "weight_gtp_shard"
        meta = state_dict.pop(meta_key, None) if meta_key in state_dict else None
        if not self.sharded or key not in state_dict:
            if meta is not None and not _whole_weight(meta, state_dict.get(key)):
                error_msgs.append(f"{key} is a GTP shard but this Linear is not sharded: merge the ranks' state "
                                  "dicts with gtp.torch.consolidate_state_dicts first")
                return
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        g = self.weight.geometry
        value = state_dict[key]
        if meta is None and tuple(value.shape) == (g.rows, g.cols):
            value = value[g.row_start:g.row_start + g.valid_rows]  # a full weight: take this rank's rows
        elif meta is None or [int(v) for v in meta] != [g.row_start, g.valid_rows, g.rows, g.cols]:
            have = "a full weight of shape " + str(tuple(value.shape)) if meta is None else \
                f"rows [{int(meta[0])}, {int(meta[0]) + int(meta[1])}) of {int(meta[2])} x {int(meta[3])}"
            error_msgs.append(f"{key}: the checkpoint holds {have} but this rank owns rows [{g.row_start}, "
                              f"{g.row_start + g.valid_rows}) of {g.rows} x {g.cols}; to re-shard (another G), "
                              "merge every rank's state dict with gtp.torch.consolidate_state_dicts and load that")
            return
        shard_only = {k: v for k, v in state_dict.items() if k != key}
        missing = []
        super()._load_from_state_dict(shard_only, prefix, local_metadata, strict, missing, unexpected_keys, error_msgs)
        missing_keys.extend(k for k in missing if k != key)
        with torch.no_grad():
            self.weight.copy_(value.to(self.weight.dtype))
        self.context.shard_updated([self.weight])  # collective: every rank loads


def _whole_weight(meta, value):
    """Whether a saved shard is its whole weight (saved at G = 1 with the machinery on): it loads into a
    plain weight as it is."""
    start, valid, rows, cols = (int(v) for v in meta)
    return value is not None and start == 0 and valid == rows and tuple(value.shape) == (rows, cols)


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity in forward; sums the input gradient over the TP group in backward (every TP rank holds
    part of a column-parallel layer's dgrad)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _AllReduce(torch.autograd.Function):
    """Sum over the TP group in forward; identity in backward (Megatron's row-parallel reduction)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None

"""ShardedParameter: this rank's rows of a GTP-sharded weight, implementing TransformerEngine's
DistributedWeight protocol (is_distributed_weight, materialize_group_for_forward / _backward,
finalize_group_grads, grad_buffer) over libgtp."""
import torch

from .context import tensor_at

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class ShardedParameter(torch.nn.Parameter):
    """A torch.nn.Parameter holding rows [row_start, row_start + valid_rows) of a rows x cols weight
    (FP32 or BF16 master). `main_grad` (FP32, same shape) receives the reduce-scattered gradient; the
    context's drain() moves it into `.grad` for ordinary optimizers.

    expert_leader: another ShardedParameter (the group's first expert) to join its expert group: the
    leader's materialize_group_* then returns every member's weight from one call, and its
    finalize_group_grads reduces every member's grad buffer.

    nvfp4_2d, mx_rounding: the wire's NVFP4 block shape and MXFP8 scale rule; gemm_scales: the GEMM layout's
    scale order, "row_major" or "blocked_128x4" (all three as gtp.Context.register takes them)."""

    is_distributed_weight = True  # TE's capability flag

    def __new__(cls, shard, context, name, rows, cols, wire="bf16", group="gtp_remat", expert_leader=None,
                nvfp4_2d=False, mx_rounding="rceil", gemm_scales="row_major"):
        if shard.dtype not in _DTYPES:
            raise ValueError(f"shard dtype {shard.dtype} is not torch.float32 or torch.bfloat16")
        geometry = context.geometry(rows, cols, wire, group)
        if tuple(shard.shape) != (geometry.valid_rows, cols):
            raise ValueError(f"shard of '{name}' has shape {tuple(shard.shape)} but this rank owns rows "
                             f"[{geometry.row_start}, {geometry.row_start + geometry.valid_rows}) of {rows} x {cols}")
        shard = shard.detach().to(context.device).contiguous()
        param = super().__new__(cls, shard, requires_grad=True)
        param.context, param.geometry = context, geometry
        param.full_shape = (rows, cols)
        param.main_grad = torch.zeros_like(shard, dtype=torch.float32)
        param.grad_added_to_main_grad = False
        param._grad_ready_hooks = []
        param._wgrad_target = None  # what grad_buffer() handed out since the last finalize
        param.gtp_weight = context.register(
            name, shard.data_ptr() if geometry.valid_rows > 0 else None, rows, cols, dtype=_DTYPES[shard.dtype],
            wire=wire, group=group, main_grad=param.main_grad.data_ptr() if geometry.valid_rows > 0 else None,
            expert_leader=None if expert_leader is None else expert_leader.gtp_weight,
            nvfp4_2d=nvfp4_2d, mx_rounding=mx_rounding, gemm_scales=gemm_scales)
        param.gtp_weight.user = param
        param.group_members = [param]  # a leader's grow with its experts, in registration order
        if expert_leader is not None:
            expert_leader.group_members.append(param)
        context.parameters.append(param)
        return param

    def __reduce_ex__(self, protocol):  # pickles (torch.save of a module) as its plain shard
        return torch.Tensor.__reduce_ex__(self.detach(), protocol)

    def __deepcopy__(self, memo):
        raise TypeError("a ShardedParameter is registered with libgtp and cannot be deep-copied; "
                        "save its state_dict and build a new model instead")

    # -- DistributedWeight protocol --
    def _materialize(self, phase):
        context = self.context
        ptrs = context.materialize([self.gtp_weight], phase, stream=context.stream())
        rows, cols = self.full_shape
        tensors = [tensor_at(p, (rows, cols), torch.bfloat16, context.device) for p in ptrs]
        return tensors[0] if len(tensors) == 1 else tensors

    def materialize_group_for_forward(self):
        """The full BF16 weight (a list for an expert group), valid until release_group()."""
        return self._materialize("forward")

    def materialize_group_for_backward(self):
        return self._materialize("backward")

    def materialize_group_views(self, phase="forward", layout="gemm"):
        """gtp.torch.Context.materialize_views of this weight (its group for a leader): a list of
        gtp.Materialized whose sections carry `.tensor`; "gemm" gives FP8 / MXFP8 / NVFP4 codes, scales and
        decode scales for a quantized GEMM. End it with release_group(layout)."""
        return self.context.materialize_views([self.gtp_weight], phase, layout=layout)

    def release_group(self, layout=None):
        """Ends the use opened by a materialize_group_* call (ordered on the current stream); name the
        layout ("bf16" or "gemm") when both are held."""
        self.context.release([self.gtp_weight], stream=self.context.stream(), layout=layout)

    def grad_buffer(self):
        """FP32 rows x cols tensor the wgrad GEMM WRITES (TE: accumulate=False, out=grad_buffer()); its
        contents are undefined. Normally libgtp's grad buffer itself, handed out without the zero-fill
        TE's overwrite would make useless. When this weight's buffer is already held (an earlier
        microbatch under accumulate_microbatches), overwriting it would lose that microbatch: a scratch
        tensor is handed out instead and finalize_group_grads adds it into the buffer. Asked for as a
        separate buffer, so that on a one-rank group too it is libgtp's own, not the main grad (which a
        written wgrad could only reach through a scratch and an add on this stream). Repeated calls
        before finalize return the same tensor."""
        if self._wgrad_target is None:
            buffer, overwrite = self.wgrad_buffer(separate=True)
            self._wgrad_target = buffer if overwrite else torch.empty_like(buffer)
        return self._wgrad_target

    def wgrad_buffer(self, separate=False):
        """(buffer, overwrite): the grad buffer without libgtp's zero-fill. overwrite True: the buffer holds
        garbage and the wgrad must be WRITTEN into it (torch.mm(..., out=buffer)); False (already handed
        out this step, e.g. an earlier microbatch, or on a one-rank group the main grad itself): ADD it.
        separate=True never hands out the main grad (GTP_GRAD_BUFFER_SEPARATE)."""
        context = self.context
        buffer = context.grad_buffer_ex(self.gtp_weight, uninitialized=True, stream=context.stream(),
                                        separate=separate)
        return tensor_at(buffer.address, self.full_shape, torch.float32, context.device), buffer.overwrite

    def finalize_group_grads(self, wgrads=None, last_microbatch=True):
        """Reduce-scatters the grad buffer (every member's, for an expert group; mean over G) into
        main_grad; asynchronous: returns None. wgrads (one per group member, in order; default: what
        grad_buffer() handed out) that are not the member's grad buffer itself are written into it (a
        buffer new this step) or added to it (one held from an earlier microbatch) first.
        last_microbatch=False (not in TE's protocol): under the context's accumulate_microbatches the
        buffer is kept for the next microbatch instead of reduced."""
        if wgrads is not None:
            wgrads = list(wgrads) if isinstance(wgrads, (list, tuple)) else [wgrads]
            if len(wgrads) != len(self.group_members):
                raise ValueError(f"finalize_group_grads got {len(wgrads)} wgrads for a group of "
                                 f"{len(self.group_members)} weights; pass one per member, leader first")
        else:  # what grad_buffer() handed out (None where the caller used wgrad_buffer() directly)
            wgrads = [member._wgrad_target for member in self.group_members]
        for member, wgrad in zip(self.group_members, wgrads):
            member._wgrad_target = None
            if wgrad is None:
                continue
            buffer, overwrite = member.wgrad_buffer()
            if wgrad.data_ptr() == buffer.data_ptr():
                continue
            if overwrite:
                buffer.copy_(wgrad)
            else:
                buffer.add_(wgrad)
        self.context.finalize([self.gtp_weight], last_microbatch=last_microbatch, stream=self.context.stream())
        self.context.note_finalized(self.group_members, reduced=last_microbatch or not self.context.accumulate_microbatches)
        for member in self.group_members:
            member.grad_added_to_main_grad = True
        return None

    def register_grad_ready_hook(self, hook):
        """hook(param) runs when libgtp has added this shard's gradient into main_grad (the DDP signal).
        Host backend: from libgtp's callback, inside finalize or drain. CUDA backend: at drain, on the
        calling thread, after .grad was updated on the current stream (libgtp's callback runs on the
        driver's host-function thread, which must not enter Python)."""
        self._grad_ready_hooks.append(hook)
        return hook


# TE's dispatchers: no-ops on plain tensors.
def is_distributed_weight(weight):
    return bool(getattr(weight, "is_distributed_weight", False))


def materialize_weight_for_forward(weights):
    leader = weights[0]
    return leader.materialize_group_for_forward() if is_distributed_weight(leader) else weights


def materialize_weight_for_backward(weights):
    leader = weights[0]
    return leader.materialize_group_for_backward() if is_distributed_weight(leader) else weights


def finalize_weight_grads(weights, wgrads):
    leader = weights[0]
    return leader.finalize_group_grads(wgrads) if is_distributed_weight(leader) else wgrads

"""ShardedParameter: this rank's rows of a GTP-sharded weight, implementing TransformerEngine's
DistributedWeight protocol (is_distributed_weight, materialize_group_for_forward / _backward,
finalize_group_grads, grad_buffer) over libgtp, exactly as TE 2.20's layers call it (docs/python.md,
"TransformerEngine")."""
import torch

from . import te_quantized

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class ShardedParameter(torch.nn.Parameter):
    """A torch.nn.Parameter holding rows [row_start, row_start + valid_rows) of a rows x cols weight
    (FP32 or BF16 master).

    Gradients arrive as TE without GTP gives them (delivered at the context's drain, after libgtp's
    reduce-scatter add has landed):
    - a wgrad the consumer computed itself (TE's fuse_wgrad_accumulation=False; gtp.torch's layers)
      is added to `.grad` in the parameter's dtype;
    - a wgrad written into grad_buffer() (TE's fuse_wgrad_accumulation=True) is added to `main_grad`,
      which accumulates until the caller zeroes it, as TE's fused accumulation does. `main_grad` is
      libgtp's FP32 target; assign another tensor of the shard's shape (FP32 or BF16, e.g. a DDP bucket
      view) and the gradient is added there instead.

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
        param.context, param.geometry, param.wire = context, geometry, wire
        param.full_shape = (rows, cols)
        # The tensor whose memory libgtp reads. A framework may later point the parameter elsewhere
        # (Megatron DDP's `param.data = <buffer view>`): sync_storage() copies it back before a re-pack.
        param._registered_shard = shard
        param.model_chunk = 0  # the virtual-pipeline chunk its materializations name (Megatron's VPP)
        param._gtp_main_grad = torch.zeros_like(shard, dtype=torch.float32)  # what libgtp adds into
        param._main_grad_target = None  # a tensor the caller assigned to main_grad, if any
        param._grad_ready_hooks = []
        param._wgrad_target = None  # what grad_buffer() handed out since the last finalize
        param._wgrad_target_is_buffer = False  # ... and whether that is libgtp's buffer itself (not a scratch)
        param._into_main_grad = False  # the last finalize's wgrad was written into grad_buffer()
        param.gtp_weight = context.register(
            name, shard.data_ptr() if geometry.valid_rows > 0 else None, rows, cols, dtype=_DTYPES[shard.dtype],
            wire=wire, group=group, main_grad=param._gtp_main_grad.data_ptr() if geometry.valid_rows > 0 else None,
            expert_leader=None if expert_leader is None else expert_leader.gtp_weight,
            nvfp4_2d=nvfp4_2d, mx_rounding=mx_rounding, gemm_scales=gemm_scales)
        param.gtp_weight.user = param
        param.group_members = [param]  # a leader's grow with its experts, in registration order
        param.is_routed_expert = expert_leader is not None  # TE's fused grouped MLP checks these two
        param.weight_list = None
        if expert_leader is not None:
            expert_leader.group_members.append(param)
            expert_leader.is_routed_expert = True
            expert_leader.weight_list = param.weight_list = expert_leader.group_members
        context.parameters.append(param)
        return param

    @property
    def main_grad(self):
        return self._gtp_main_grad if self._main_grad_target is None else self._main_grad_target

    @main_grad.setter
    def main_grad(self, value):
        if value is None or value is self._gtp_main_grad:
            self._main_grad_target = None
            return
        if tuple(value.shape) != tuple(self.shape) or value.device != self.device or \
                value.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"main_grad of '{self.gtp_weight.name}' must be an FP32 or BF16 tensor of the shard's "
                             f"shape {tuple(self.shape)} on {self.device}; got {value.dtype} "
                             f"{tuple(value.shape)} on {value.device}")
        self._main_grad_target = value

    def sync_storage(self):
        """Copies the parameter's values into the memory libgtp registered when they are no longer the
        same memory (its storage was replaced, e.g. by Megatron DDP's parameter buffer); returns whether
        it copied. The context's shard_updated calls it before every re-pack."""
        registered = self._registered_shard
        if self.numel() == 0 or self.data_ptr() == registered.data_ptr():
            return False
        if tuple(self.shape) != tuple(registered.shape) or self.dtype != registered.dtype:
            raise ValueError(f"'{self.gtp_weight.name}' now holds a {self.dtype} {tuple(self.shape)} tensor but libgtp "
                             f"registered a {registered.dtype} {tuple(registered.shape)} shard; replace .data only by "
                             "a tensor of the same shape and dtype")
        with torch.no_grad():
            registered.copy_(self.detach())
        return True

    def __reduce_ex__(self, protocol):  # pickles (torch.save of a module) as its plain shard
        return torch.Tensor.__reduce_ex__(self.detach(), protocol)

    def __deepcopy__(self, memo):
        raise TypeError("a ShardedParameter is registered with libgtp and cannot be deep-copied; "
                        "save its state_dict and build a new model instead")

    # -- DistributedWeight protocol --
    def _materialize(self, phase):
        """The group's weights for TE: TE's quantized tensors on the wire's own codes under a matching TE
        recipe (te_quantized), else BF16. Each opens a use the context ends at its next materialize, at
        drain, or at release_group(): TE never releases (docs/python.md, "Lifetime")."""
        context = self.context
        context.end_open_uses()
        stream = context.stream()
        quantized = te_quantized.recipe_layout(self, phase)
        if quantized in te_quantized.GEMM_LAYOUTS:
            views = context.materialize_views([self.gtp_weight], phase, self.model_chunk, layout="gemm", stream=stream)
            context.open_use(self, "gemm", stream)
            tensors = te_quantized.gemm_tensors(context, quantized, views, self.group_members)
        else:
            ptrs = context.materialize([self.gtp_weight], phase, model_chunk=self.model_chunk, stream=stream)
            context.open_use(self, "bf16", stream)
            rows, cols = self.full_shape
            if quantized == te_quantized.QUANTIZE_BF16:
                tensors = [te_quantized.quantize_bf16(context.view_at(p, (rows, cols), torch.bfloat16), m)
                           for p, m in zip(ptrs, self.group_members)]
            else:  # requires_grad as the parameter's: TE reads requires_wgrad from what it receives
                tensors = [context.view_at(p, (rows, cols), torch.bfloat16, m.requires_grad)
                           for p, m in zip(ptrs, self.group_members)]
        return tensors[0] if len(tensors) == 1 else tensors

    def materialize_group_for_forward(self):
        """The full weight (a list for an expert group): BF16, or TE's quantized tensor under a TE recipe
        that matches the wire. Valid until this context's next materialize, its drain, or release_group()."""
        return self._materialize("forward")

    def materialize_group_for_backward(self):
        return self._materialize("backward")

    def materialize_group_views(self, phase="forward", layout="gemm"):
        """gtp.torch.Context.materialize_views of this weight (its group for a leader): a list of
        gtp.Materialized whose sections carry `.tensor`; "gemm" gives FP8 / MXFP8 / NVFP4 codes, scales and
        decode scales for a quantized GEMM. End it with release_group(layout)."""
        return self.context.materialize_views([self.gtp_weight], phase, layout=layout)

    def release_group(self, layout=None):
        """Ends a use opened by a materialize_group_* call now (ordered on the current stream) rather than
        at the context's next materialize; name the layout ("bf16" or "gemm") when both are held."""
        self.context.close_use(self, layout)
        self.context.release([self.gtp_weight], stream=self.context.stream(), layout=layout)

    def grad_buffer(self):
        """FP32 rows x cols tensor the wgrad GEMM WRITES (TE: accumulate=False, out=grad_buffer()); its
        contents are undefined. Normally libgtp's grad buffer itself, handed out without the zero-fill
        TE's overwrite would make useless. When this weight's buffer is already held (an earlier
        microbatch under accumulate_microbatches), overwriting it would lose that microbatch: a scratch
        tensor is handed out instead and finalize_group_grads adds it into the buffer. Asked for as a
        separate buffer, so that on a one-rank group too it is libgtp's own, not the main grad (which a
        written wgrad could only reach through a scratch and an add on this stream), except the first
        after the main grads were declared zero (Context.main_grads_zeroed): then it is libgtp's FP32
        target itself, written with no add. Repeated calls before finalize return the same tensor."""
        if self._wgrad_target is None:
            buffer, overwrite = self.wgrad_buffer(separate=True)
            self._wgrad_target = buffer if overwrite else torch.empty_like(buffer)
            self._wgrad_target_is_buffer = overwrite
        return self._wgrad_target

    def wgrad_buffer(self, separate=False):
        """(buffer, overwrite): the grad buffer without libgtp's zero-fill. overwrite True: the buffer holds
        garbage and the wgrad must be WRITTEN into it (torch.mm(..., out=buffer)); False (already handed
        out this step, e.g. an earlier microbatch, or on a one-rank group the main grad itself): ADD it.
        separate=True never hands out the main grad (GTP_GRAD_BUFFER_SEPARATE)."""
        context = self.context
        buffer = context.grad_buffer_ex(self.gtp_weight, uninitialized=True, stream=context.stream(),
                                        separate=separate)
        return context.view_at(buffer.address, self.full_shape, torch.float32), buffer.overwrite

    def finalize_group_grads(self, wgrads=None, last_microbatch=None):
        """Reduce-scatters the grad buffer (every member's, for an expert group; mean over G) into the
        shards' gradients, asynchronously: returns None, or one None per member for an expert group (TE's
        GroupedLinear takes the return as the per-expert grads). wgrads (one per group member, in order,
        or a bare tensor; default: what grad_buffer() handed out) that are not the member's grad buffer
        are written into it (a buffer new this step) or added to it (one held from an earlier
        microbatch, or an earlier use, add_group_grads) first. A wgrad that is what grad_buffer() handed
        out goes to main_grad at drain, any other to .grad (see the class).
        last_microbatch (not in TE's protocol; default: the context's last_microbatch()): under the
        context's accumulate_microbatches False keeps the buffer for the next microbatch."""
        self._stage(wgrads, earlier=self.context.undefer(self))  # an earlier use's add is reduced here too
        if last_microbatch is None:
            last_microbatch = self.context.last_microbatch()
        self.context.finalize([self.gtp_weight], last_microbatch=last_microbatch, stream=self.context.stream())
        self.context.note_finalized(self.group_members,
                                    reduced=last_microbatch or not self.context.accumulate_microbatches)
        self.context.queue_drain()
        return None if len(self.group_members) == 1 else [None] * len(self.group_members)

    def add_group_grads(self, wgrads=None):
        """finalize_group_grads for a weight with several consumers in one backward pass (a tied
        embedding and output layer): adds the wgrads into the grad buffer, which stays held, and leaves
        its one reduce-scatter to the context's drain (Context.defer_finalize), after every consumer
        has added its own. Same arguments and return as finalize_group_grads."""
        self._stage(wgrads, earlier=self.context.undefer(self))
        self.context.defer_finalize(self)
        self.context.queue_drain()
        return None if len(self.group_members) == 1 else [None] * len(self.group_members)

    def _stage(self, wgrads, earlier=False):
        """Moves each member's wgrad into its grad buffer (see finalize_group_grads). earlier: an earlier
        use of this backward pass added into the buffer already; a wgrad written into grad_buffer() by
        any use sends the sum to main_grad."""
        if wgrads is not None:
            wgrads = list(wgrads) if isinstance(wgrads, (list, tuple)) else [wgrads]
            if len(wgrads) != len(self.group_members):
                raise ValueError(f"finalize_group_grads got {len(wgrads)} wgrads for a group of "
                                 f"{len(self.group_members)} weights; pass one per member, leader first")
        else:  # what grad_buffer() handed out (None where the caller used wgrad_buffer() directly)
            wgrads = [member._wgrad_target for member in self.group_members]
        for member, wgrad in zip(self.group_members, wgrads):
            handed_out, member._wgrad_target = member._wgrad_target, None
            is_buffer, member._wgrad_target_is_buffer = member._wgrad_target_is_buffer, False
            member._into_main_grad = (earlier and member._into_main_grad) or (
                wgrad is not None and handed_out is not None and wgrad.data_ptr() == handed_out.data_ptr())
            if wgrad is None:
                continue
            if is_buffer and wgrad.data_ptr() == handed_out.data_ptr():
                continue  # written into libgtp's buffer itself, which grad_buffer() handed out: nothing to move
            buffer, overwrite = member.wgrad_buffer()
            if wgrad.data_ptr() == buffer.data_ptr():
                continue
            if overwrite:
                buffer.copy_(wgrad)
            else:
                buffer.add_(wgrad)

    def deliver_grad(self):
        """Called by the context's drain once libgtp's add into the FP32 target has landed (ordered on
        the current stream): moves it where the class docstring says. Returns whether it zeroed libgtp's
        target (then declared zero by the drain)."""
        staged = self._gtp_main_grad
        if not self._into_main_grad:
            grad = staged.to(self.dtype, copy=True)
            if self.grad is None:
                self.grad = grad
            else:
                self.grad.add_(grad)
            staged.zero_()
            return True
        if self._main_grad_target is not None:
            self._main_grad_target.add_(staged)
            staged.zero_()
            return True
        return False

    def register_grad_ready_hook(self, hook):
        """hook(param) runs when this shard's gradient has been delivered (the DDP signal): at drain, on
        the calling thread, after the delivery was ordered on the current stream (on CUDA libgtp's own
        callback runs on the driver's host-function thread, which must not enter Python)."""
        self._grad_ready_hooks.append(hook)
        return hook


# TE's dispatchers (transformer_engine.pytorch.distributed_weight), with its exact contract: always a
# list; the leader weights[0] stands for its group; plain tensors pass through.
def is_distributed_weight(weight):
    flag = bool(getattr(weight, "is_distributed_weight", False))
    if flag and not isinstance(weight, torch.Tensor):
        raise TypeError(f"DistributedWeight implementers must be torch.Tensor subclasses; got {type(weight).__name__}")
    return flag


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def materialize_weight_for_forward(weights):
    weights = _as_list(weights)
    return _as_list(weights[0].materialize_group_for_forward()) if is_distributed_weight(weights[0]) else weights


def materialize_weight_for_backward(weights):
    weights = _as_list(weights)
    return _as_list(weights[0].materialize_group_for_backward()) if is_distributed_weight(weights[0]) else weights


def finalize_weight_grads(weights, wgrads):
    weights, wgrads = _as_list(weights), list(wgrads)
    if not is_distributed_weight(weights[0]):
        return wgrads
    return _as_list(weights[0].finalize_group_grads(wgrads if len(wgrads) > 1 else wgrads[0]))

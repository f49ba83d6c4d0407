"""gtp.torch.Context: a gtp.Context that speaks torch (stores, streams, tensors, parameters)."""
import ctypes
import datetime

import torch

from .. import context as core
from .._checks import choice
from .._enums import GROUPS


class TorchStore:
    """The set/get/wait view gtp.bootstrap wants of a torch.distributed.Store (TCPStore, FileStore...)."""

    def __init__(self, store):
        self.store = store

    def set(self, key, value):
        self.store.set(key, value)

    def get(self, key):
        return self.store.get(key)

    def wait(self, keys, timeout_s):
        self.store.wait(keys, datetime.timedelta(seconds=timeout_s))


class _CudaArray:
    """Exposes a device pointer through __cuda_array_interface__ (v3) so torch.as_tensor wraps it
    without a copy. No stream is given, so torch does not synchronize: ordering is the caller's."""

    def __init__(self, address, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (address, False),
                                         "version": 3, "strides": None, "stream": None}


# __cuda_array_interface__ typestr per dtype; it has no bfloat16, so BF16 is wrapped as int16 and reinterpreted.
_TYPESTRS = {torch.bfloat16: "<i2", torch.float32: "<f4", torch.uint8: "|u1"}
_MAX_VIEWS = 4096
# torch's current CUDA stream of a device as its raw cudaStream_t (what torch.cuda.current_stream(d).cuda_stream
# gives, without building the Stream object); None in a torch without it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# Section element types (gtp.Section.dtype) as tensors: codes and scales are raw bytes, as TE keeps them.
SECTION_DTYPES = {"bf16": torch.bfloat16, "e4m3": torch.uint8, "e2m1": torch.uint8, "e8m0": torch.uint8,
                  "fp32": torch.float32}


def tensor_at(address, shape, dtype, device):
    """A tensor viewing memory libgtp owns (no copy). Valid until that memory's release (see docs/python.md)."""
    count = 1
    for extent in shape:
        count *= extent
    if device.type == "cuda":
        if dtype not in _TYPESTRS:
            raise ValueError(f"dtype {dtype} cannot wrap a libgtp pointer; use one of {sorted(map(str, _TYPESTRS))}")
        with torch.cuda.device(device):
            return torch.as_tensor(_CudaArray(address, shape, _TYPESTRS[dtype]), device=device).view(dtype)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    buffer = (ctypes.c_char * (count * itemsize)).from_address(address)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(*shape)


class Context(core.Context):
    """gtp.Context over a torch.distributed.Store (or any set/get store, or None for gtp-launch's UCX).

    backend: "host" (CPU tensors, NULL streams) or "cuda" (tensors on `device`, the current stream).
    auto_drain: drain at the end of every backward pass (queued on autograd's engine by the first
    gtp.torch.Linear backward); False: call drain() yourself after backward, before optimizer.step().
    machinery_at_g1: False (default): a group of one rank is inert, as Megatron-Core's GTP is at size 1:
    the layers built on this context (gtp.torch.Linear, GroupedLinear, te.distribute, gtp.megatron)
    keep plain weights in such a group, with no gather, copy, separate wgrad add or libgtp call (see
    uses_libgtp). True: they go on libgtp at G = 1 too (the whole machinery, as at G > 1: for tests and
    for measuring it on one GPU).
    """

    def __init__(self, store=None, rank=None, world_size=None, *, backend="host", device=None, auto_drain=True,
                 machinery_at_g1=False, **kwargs):
        if store is not None and isinstance(store, torch.distributed.Store):
            store = TorchStore(store)
        if backend == "cuda":
            self.device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
            # No libgtp grad-ready callback: on CUDA it runs on the driver's host-function thread, which
            # must not enter Python (it would wait for the GIL while holding the stream). drain() moves
            # the grads and runs the hooks instead.
            with torch.cuda.device(self.device):  # libgtp's CUDA backend takes the current device at create
                super().__init__(store, rank, world_size, backend=backend, **kwargs)
        else:
            self.device = torch.device("cpu")
            super().__init__(store, rank, world_size, backend=backend, grad_ready=self._route_grad_ready, **kwargs)
        self._cuda = self.device.type == "cuda"
        self._device_index = self.device.index if self._cuda else None
        self.auto_drain = auto_drain
        self.machinery_at_g1 = bool(machinery_at_g1)
        self._ready = []            # host: parameters whose main-grad add ran since the last drain
        self._finalized = []        # CUDA: parameters finalized since the last drain
        self._deferred = []         # leaders whose one reduce-scatter waits for drain (add_group_grads)
        self._drain_queued = False
        self._drains_per_step = 0  # attach_optimizer's microbatches; 0: no optimizer attached
        self._drains = 0
        self._drains_this_step = 0     # drains since the last optimizer_stepped()
        self._drains_last_step = 0     # how many the last step had (optimizer_stepped); 0: unknown
        self.parameters = []        # every ShardedParameter registered on this context
        self._open_uses = []        # (leader, layout, stream) of protocol materializations not yet ended
        self._views = {}            # cached_view's objects by the memory they view

    def uses_libgtp(self, group="gtp_remat"):
        """Whether layers built on this context put the weights of `group` ("gtp_remat" or
        "expert_gtp_remat") on libgtp: at G > 1 always; in a group of one only with machinery_at_g1=True,
        else they stay plain parameters (inert, as Megatron-Core's GTP at size 1)."""
        choice(GROUPS, group, "group")
        return self.machinery_at_g1 or self.group_size(group) > 1

    def view_at(self, address, shape, dtype, requires_grad=False):
        """tensor_at on this context's device, the same tensor object for the same memory, shape, dtype
        and requires_grad: libgtp hands out the same slots every step once warm, and wrapping a pointer
        (torch.as_tensor over __cuda_array_interface__) costs tens of microseconds per call, several
        per materialize. A cached tensor only views memory; it never keeps any alive. requires_grad is
        part of the key so that a tensor TE kept from one weight never changes under it."""
        def wrap():
            tensor = tensor_at(address, shape, dtype, self.device)
            return tensor.requires_grad_(True) if requires_grad else tensor
        return self.cached_view((address, tuple(shape), dtype, requires_grad), wrap)

    def cached_view(self, key, make):
        """The object make() built for `key` (a tuple naming libgtp memory and how it is viewed), built
        once: view_at's tensors, and TE's quantized tensors over a slot's sections."""
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:  # addresses only repeat once warm; never grow without bound
                self._views.clear()
            view = self._views[key] = make()
        return view

    def stream(self):
        """The stream libgtp enqueues on: torch's current stream on CUDA, NULL (None) on the host. Called
        several times per weight per microbatch: the raw handle, without the torch.cuda.Stream object
        torch.cuda.current_stream builds."""
        if not self._cuda:
            return None
        if _RAW_STREAM is not None and self._device_index is not None:
            return _RAW_STREAM(self._device_index)
        return torch.cuda.current_stream(self.device).cuda_stream

    def materialize_views(self, weights, phase="forward", model_chunk=0, layout="gemm", stream=None):
        """gtp.Context.materialize_views on the current stream, every section also a tensor
        (`section.tensor`, on ctx.device, no copy; codes and scales as uint8 bytes). weights: gtp.Weight
        or ShardedParameter objects. Valid until release(weights, layout=...)."""
        handles = [getattr(w, "gtp_weight", w) for w in weights]
        views = super().materialize_views(handles, phase, model_chunk, layout, self.stream() if stream is None else stream)
        for view in views:
            for section in view.sections().values():
                _, items, ld_items = section.storage
                section.tensor = self.view_at(section.address, (section.rows, ld_items),
                                              SECTION_DTYPES[section.dtype])[:, :items]
        return views

    def release(self, weights, stream=None, layout=None):
        """gtp.Context.release on the current stream; weights: gtp.Weight or ShardedParameter objects."""
        super().release([getattr(w, "gtp_weight", w) for w in weights], self.stream() if stream is None else stream,
                        layout)

    # -- the lifetime of what TE receives: TE's DistributedWeight protocol has no release call --
    def open_use(self, leader, layout, stream):
        """Records a materialization handed out by ShardedParameter._materialize (on `stream`)."""
        self._open_uses.append((leader, layout, stream))

    def close_use(self, leader, layout=None):
        """Forgets the open use of `leader` (in `layout`, if named) that release_group() ends itself."""
        for i, (held, held_layout, _) in enumerate(self._open_uses):
            if held is leader and layout in (None, held_layout):
                del self._open_uses[i]
                return

    def end_open_uses(self):
        """Ends every open use, each ordered after the work enqueued so far on its own stream. Called
        before each protocol materialize and at drain: TE's layers enqueue all their GEMMs on a
        materialized weight before the next layer materializes, and what they keep of it past that point
        (LayerNormLinear's ctx.weight, GroupedLinear's weakrefs) is never read again; so one open use at
        a time keeps the cache within (prefetch depth + 1) x the largest group (docs/python.md)."""
        uses, self._open_uses = self._open_uses, []
        for leader, layout, stream in uses:
            super().release([leader.gtp_weight], stream, layout)

    def _route_grad_ready(self, weight):
        param = weight.user
        if param is None:
            return
        self._ready.append(param)  # delivered, and its hooks run, at drain

    def queue_drain(self):
        """Drain at the end of the running backward pass (once per pass)."""
        if self.auto_drain and not self._drain_queued and torch._C._current_graph_task_id() != -1:
            self._drain_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.drain)

    def defer_finalize(self, leader):
        """Leaves the finalize of `leader` (a ShardedParameter whose consumers add their wgrads with
        add_group_grads) to the next drain: one reduce-scatter of the sum of its uses."""
        if not any(held is leader for held in self._deferred):  # by identity: == on tensors compares values
            self._deferred.append(leader)

    def undefer(self, leader):
        """Takes `leader` off the drain's finalize list; returns whether it was on it (an add is held)."""
        if not self._deferred:  # the usual case, on every finalize
            return False
        kept = [held for held in self._deferred if held is not leader]
        taken = len(kept) != len(self._deferred)
        self._deferred = kept
        return taken

    def _finalize_deferred(self):
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        last = self.last_microbatch()  # before this drain is counted, as the layers' finalize sees it
        self.finalize([p.gtp_weight for p in deferred], last_microbatch=last, stream=self.stream())
        for leader in deferred:
            self.note_finalized(leader.group_members, reduced=last or not self.accumulate_microbatches)

    def drain(self, stream=None, defer_head=None):
        """End of backward: reduce-scatters the weights whose finalize was deferred (defer_finalize),
        ends the open uses, applies pending main-grad adds, then delivers each ready
        shard's gradient (ShardedParameter: into .grad, or main_grad), ordered on the current stream.
        defer_head leaves the next step's head to the next shard_updated, so it is gathered once, from
        the updated shards. Default: on the drain that ends each optimizer step once attach_optimizer
        was called (every `microbatches`-th drain); else, when the framework reports its optimizer steps
        (optimizer_stepped), on the drain that ends a step of as many drains as the last one had;
        else off. The drains known to come before a step's last (the same two counts) leave the
        divergence check to that last one (midstep): one tag collective per step, not per drain."""
        self._finalize_deferred()
        self._drain_queued = False
        midstep = False
        if defer_head is None:
            self._drains += 1
            self._drains_this_step += 1
            if self._drains_per_step > 0:
                defer_head = self._drains % self._drains_per_step == 0
                midstep = not defer_head
            else:
                defer_head = self._drains_this_step == self._drains_last_step
                midstep = self._drains_this_step < self._drains_last_step
        self.end_open_uses()
        if self._weights or self.closed:  # nothing registered (every layer inert at G = 1): no call
            super().drain(self.stream() if stream is None else stream, defer_head=defer_head, midstep=midstep)
        # The host backend has run every callback by now. On CUDA the adds are only enqueued: every
        # parameter finalized since the last drain has its add ordered before the current stream's
        # next work (drain joined it), so its grad moves there, and its hooks run here.
        cuda = self._cuda
        if cuda:
            ready, self._finalized = self._finalized, []
        else:
            ready, self._ready = self._ready, []
        ready = list(dict.fromkeys(ready))  # once each, in order
        zeroed = [param for param in ready if param.deliver_grad()]
        # Their FP32 staging is zero again (on the current stream): the next backward's first wgrad may be
        # written straight into it. Nothing of theirs is in flight now (drain applied every add); a replay
        # of a captured step could not honour it, so not under capture.
        if zeroed and not (cuda and torch.cuda.is_current_stream_capturing()):
            self.main_grads_zeroed(zeroed)
        for param in ready:
            for hook in param._grad_ready_hooks:
                hook(param)

    def main_grads_zeroed(self, params=None):
        """gtp.Context.main_grads_zeroed for ShardedParameters (or gtp.Weights); None: every weight. Call it
        after zeroing `param.main_grad` (FP32, libgtp's own: no other tensor assigned to main_grad), on
        the current stream, after the backward's drain: each weight's first grad_buffer() afterwards is
        that main grad, written by TE without the add. A main_grad assigned by the caller (a DDP bucket
        view) needs no call: gtp.torch declares its own staging zero after each delivery."""
        if params is not None:
            params = [getattr(p, "gtp_weight", p) for p in params]
        if self._weights or self.closed:  # nothing registered: nothing to declare, no call
            super().main_grads_zeroed(params)

    def note_finalized(self, params, reduced=True):
        """Called by ShardedParameter.finalize_group_grads: on CUDA, drain() moves the grads of those that
        were reduced (not kept for the next microbatch)."""
        if self._cuda and reduced:
            self._finalized.extend(params)

    def last_microbatch(self):
        """Whether the running backward pass is the last of its optimizer step: always, unless the
        context accumulates microbatches (accumulate_microbatches=True) and attach_optimizer said how
        many backward passes a step has; then only every `microbatches`-th. gtp.torch layers finalize
        with it, so their wgrads add up in the grad buffers and are reduced once per step."""
        if not self.accumulate_microbatches or self._drains_per_step <= 1:
            return True
        return self._drains % self._drains_per_step == self._drains_per_step - 1

    def shard_updated(self, weights=None, stream=None):
        """Collective re-pack of the wire chunks after an optimizer step. weights: gtp.Weight or
        ShardedParameter objects; None: every parameter of this context."""
        if not self._weights and not self.closed:  # nothing registered (every layer inert at G = 1): no call
            return
        items = self.parameters if weights is None else list(weights)
        for item in items:  # a parameter whose storage was replaced: its new values into libgtp's shard
            for member in getattr(item, "group_members", ()):
                member.sync_storage()
        super().shard_updated([getattr(w, "gtp_weight", w) for w in items],
                              self.stream() if stream is None else stream)

    def optimizer_stepped(self):
        """Tells the context that an optimizer step ended (before its re-pack), for frameworks that step
        their own optimizers (gtp.megatron): the drains since the last step are how many the next step
        is expected to have, so that its last drain leaves the next step's head to the re-pack instead
        of gathering it from the shards the step is about to change (a gather wasted every step)."""
        self._drains_last_step, self._drains_this_step = self._drains_this_step, 0

    def attach_optimizer(self, optimizer, microbatches=1):
        """After every optimizer.step(), re-pack this context's shards (collective: every rank steps).
        microbatches: backward passes (drains) per optimizer step; the last drain of each step defers
        the next step's head to that re-pack (see drain), the others keep prefetching it."""
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be at least 1 (backward passes per optimizer step)")
        self._drains_per_step = microbatches
        self._drains = 0
        return optimizer.register_step_post_hook(lambda *_: self.shard_updated())

"""DDP's overlapped parameter all-gather (overlap_param_gather=True) on libgtp.

With the distributed optimizer, an optimizer step writes only this DP rank's slice of DDP's parameter
buffer; with overlap_param_gather the other ranks' slices arrive by an asynchronous all-gather per
bucket group that Megatron-Core finishes in the next forward (DDP's forward pre-hook calls
_ParamAndGradBucketGroup.finish_param_sync), or synchronously through start_param_sync(force_sync=True)
(disable_forward_pre_hook, before evaluation and checkpoints). A libgtp shard re-packed at the step
would read half-old values. So the step re-packs only the weights whose buckets are final; the others
wait on their bucket groups and are re-packed when the last of their groups has gathered, before the
module that uses them runs (the pre-hook runs before the module's forward). A weight prefetched from
a group not yet gathered is re-gathered by libgtp at that re-pack (stale_prefetches): the cost of the
overlap, about one gather per bucket-group boundary the prefetch window crosses.

shard_updated is collective over each weight's GTP group. Every rank of a GTP group holds the same
model (the same layers, each a shard of the same shape), so DDP builds the same buckets and bucket
groups in the same order on each; the forward calls the same modules in the same order, so their
pre-hooks finish the same groups in the same order, and a disable_forward_pre_hook or start_param_sync
runs on every rank at the same point of the training loop. Each rank therefore re-packs the same
weights at the same point of its sequence of libgtp calls."""
import weakref


class ParamGather:
    """The weights waiting for their bucket groups' parameter all-gather, and the patches that re-pack
    them when it ends. Installed by Backend.install (its _set: reset restores Megatron's functions)."""

    def __init__(self, backend):
        self.backend = backend
        self.ddps = weakref.WeakSet()  # every Megatron DDP built since use_libgtp (the model is built after it)
        self.waiting = {}              # bucket group -> {leader: None} waiting for it, in build order
        self.outstanding = {}          # leader -> how many of its groups have not gathered yet
        self.batch = None              # while DDP.start_param_sync runs: leaders made ready, re-packed at its end

    def install(self):
        from megatron.core.distributed import distributed_data_parallel as ddp_module
        from megatron.core.distributed import param_and_grad_buffer as buffers
        ddp_class, group_class = ddp_module.DistributedDataParallel, buffers._ParamAndGradBucketGroup
        gather = self

        def init(self_, *args, _orig=ddp_class.__init__, **kwargs):
            _orig(self_, *args, **kwargs)
            gather.ddps.add(self_)

        def finish_param_sync(self_, *args, _orig=group_class.finish_param_sync, **kwargs):
            result = _orig(self_, *args, **kwargs)
            gather.gathered(self_)
            return result

        def start_param_sync(self_, *args, _orig=group_class.start_param_sync, **kwargs):
            result = _orig(self_, *args, **kwargs)
            gather.gathered(self_)  # force_sync: gathered now; else dispatched, finished later
            return result

        def ddp_start_param_sync(self_, *args, _orig=ddp_class.start_param_sync, **kwargs):
            """All of a DDP's groups at once (force_sync): one re-pack after them, so libgtp's head
            prefetch follows the last group instead of reading groups not yet gathered."""
            if gather.batch is not None:
                return _orig(self_, *args, **kwargs)
            gather.batch = []
            try:
                result = _orig(self_, *args, **kwargs)
                ready = gather.batch
            finally:
                gather.batch = None
            if ready:
                gather.backend.context.shard_updated(ready)
            return result

        for cls, name, value in ((ddp_class, "__init__", init), (group_class, "finish_param_sync", finish_param_sync),
                                 (group_class, "start_param_sync", start_param_sync),
                                 (ddp_class, "start_param_sync", ddp_start_param_sync)):
            self.backend._set(cls, name, value)

    def after_step(self, leaders):
        """At the end of an optimizer step: the leaders to re-pack now. Those with a member in a bucket
        group whose overlapped all-gather has not run yet wait for it (gathered)."""
        now = []
        for leader in leaders:
            groups = list(dict.fromkeys(g for g in map(self._group_of, leader.group_members)
                                        if g is not None and not _gathered(g)))
            if not groups:
                if leader not in self.outstanding:  # else its group's next finish_param_sync re-packs it
                    now.append(leader)
                continue
            for group in groups:
                waiting = self.waiting.setdefault(group, {})  # by identity: a list's `in` compares values
                if leader not in waiting:
                    waiting[leader] = None
                    self.outstanding[leader] = self.outstanding.get(leader, 0) + 1
        return now

    def gathered(self, group):
        """After a bucket group's all-gather call: once it has gathered, re-pack the leaders that waited
        only for it (collective: see the module's docstring for why every GTP rank gets here alike)."""
        if group not in self.waiting or not _gathered(group):
            return
        ready = []
        for leader in self.waiting.pop(group):
            self.outstanding[leader] -= 1
            if self.outstanding[leader] == 0:
                del self.outstanding[leader]
                ready.append(leader)
        if not ready:
            return
        if self.batch is not None:
            self.batch.extend(ready)
        else:
            self.backend.context.shard_updated(ready)

    def _group_of(self, param):
        for ddp in self.ddps:
            group = ddp.param_to_bucket_group.get(param)
            if group is not None:
                return group
        return None


def _gathered(group):
    """Whether a bucket group's parameters are whole: no overlapped all-gather still to dispatch
    (finish_grad_sync clears param_gather_dispatched each step) or in flight (param_gather_handle)."""
    if not group.ddp_config.overlap_param_gather:
        return True  # gathered synchronously inside the optimizer step
    return group.param_gather_dispatched and group.param_gather_handle is None

"""torch_dist checkpoints of libgtp shards, in Megatron-Core's ShardedTensor terms.

A libgtp shard is rows [row_start, row_start + valid_rows) of the TP-local weight. It is saved as
that block of the weight, with the weight's global shape and Megatron's TP offset, so the checkpoint
holds exactly what a GTP-off run writes: it loads with GTP off, or at another G whose shards are
again a regular split. At G = 1 the shard is the whole TP-local weight. Megatron-Core
0.19's torch_dist strategy needs a regular grid of equal shards, so at G > 1 a weight whose rows
libgtp pads (rows not a multiple of row alignment x G) is refused with the sizes that would work."""
from ..weight import row_alignment


def is_libgtp(tensor):
    from .param import MegatronParameter
    return isinstance(tensor, MegatronParameter)


def regular_split(geometry):
    """Whether every rank of the group holds the same number of real rows (no padding)."""
    return geometry.padded_rows == geometry.rows


def check_regular(name, geometry, wire):
    if not regular_split(geometry):
        align = row_alignment(wire) * geometry.group_size
        raise ValueError(f"{name}: {geometry.rows} rows over G={geometry.group_size} are padded to "
                         f"{geometry.padded_rows} by libgtp (row alignment x G = {align}); Megatron-Core's torch_dist "
                         f"format needs equal shards: choose a size whose TP-local rows are a multiple of {align}, or "
                         "save at G = 1")


def checked_tp_sharded_tensor(make_tp_sharded_tensor):
    """Megatron-Core's make_tp_sharded_tensor_for_checkpoint, which layers that cannot use the GTP helper
    call directly (VocabParallelEmbedding, the tied output weight): it offsets a GTP shard as one of G
    equal blocks, so a padded split would be saved at wrong offsets. Refused there as in
    make_sharded_tensors."""
    def make(tensor, key, *args, **kwargs):
        if is_libgtp(tensor):
            check_regular(key, tensor.geometry, tensor.wire)
        return make_tp_sharded_tensor(tensor, key, *args, **kwargs)
    make.__doc__ = make_tp_sharded_tensor.__doc__
    return make


def make_sharded_tensors(state_dict, prefix, *args, **kwargs):
    """libgtp's make_sharded_tensors_for_checkpoint_with_gtp_remat (same signature). A libgtp shard of a
    regular split is exactly the block Megatron-Core's helper describes for its own GTP weight (TP and G
    composed on axis 0, the writer elected over the replicate group, biases' replica ids per G rank),
    so that helper does the rest, with the parameter itself as the data (the distributed optimizer
    finds its state by the parameter's identity)."""
    from megatron.core.tensor_parallel import generalized_tensor_parallelism as mgtp
    for name, tensor in state_dict.items():
        if is_libgtp(tensor):
            check_regular(f"{prefix}{name}", tensor.geometry, tensor.wire)
    return mgtp.make_sharded_tensors_for_checkpoint_with_gtp_remat(state_dict, prefix, *args, **kwargs)

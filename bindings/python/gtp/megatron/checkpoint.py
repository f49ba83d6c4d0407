"""torch_dist checkpoints of libgtp shards, in Megatron-Core's ShardedTensor terms.

A libgtp shard is rows [row_start, row_start + valid_rows) of the TP-local weight. It is saved as
that block of the weight, with the weight's logical (unpadded) global shape and Megatron's TP offset,
so the checkpoint holds exactly what a GTP-off run writes: it loads with GTP off, or at another G whose
shards are again a regular split. At G = 1 the shard is the whole TP-local weight. Megatron-Core
0.19's torch_dist strategy needs a regular grid of equal shards, so at G > 1 a weight whose rows
libgtp pads (rows not a multiple of row alignment x G) is refused with the sizes that would work."""


def is_libgtp(tensor):
    from .param import MegatronParameter
    return isinstance(tensor, MegatronParameter)


def regular_split(geometry):
    """Whether every rank of the group holds the same number of real rows (no padding)."""
    return geometry.padded_rows == geometry.rows


def check_regular(name, geometry, wire):
    if not regular_split(geometry):
        from .. import context as core
        align = core.row_alignment(wire) * geometry.group_size
        raise ValueError(f"{name}: {geometry.rows} rows over G={geometry.group_size} are padded to "
                         f"{geometry.padded_rows} by libgtp (row alignment x G = {align}); Megatron-Core's torch_dist "
                         f"format needs equal shards: choose a size whose TP-local rows are a multiple of {align}, or "
                         "save at G = 1")


def make_sharded_tensors(state_dict, prefix, tensor_parallel_layers_axis_map=None, sharded_offsets=(),
                         extra_state_suffix="_extra_state", *, tp_group, dp_cp_group, intra_dp_cp_group=None):
    """libgtp's make_sharded_tensors_for_checkpoint_with_gtp_remat (same signature)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
    from megatron.core.utils import get_pg_rank, get_pg_size

    axis_map = dict(tensor_parallel_layers_axis_map or {})
    # Megatron-Core's own helper for the rest: it consults gtp_api only for GTP weights, none of these.
    plain = {k: (v.detach() if is_libgtp(v) and v.geometry.group_size == 1 else v) for k, v in state_dict.items()}
    ours = {k: v for k, v in plain.items() if is_libgtp(v)}
    sharded = make_sharded_tensors_for_checkpoint({k: v for k, v in plain.items() if k not in ours}, prefix,
                                                  axis_map, sharded_offsets, extra_state_suffix=extra_state_suffix,
                                                  tp_group=tp_group, dp_cp_group=dp_cp_group)
    if not ours:
        return sharded
    tp_rank, tp_size = get_pg_rank(tp_group), get_pg_size(tp_group)
    if intra_dp_cp_group is not None:
        replica = get_pg_rank(intra_dp_cp_group)
    else:  # one writer per shard: the first rank of its replicate group (DP without G)
        from megatron.core import parallel_state
        replica = parallel_state.get_data_parallel_rank(with_context_parallel=True, with_gtp_remat=False)
    for name, param in ours.items():
        key = f"{prefix}{name}"
        g = param.geometry
        check_regular(key, g, param.wire)
        tp_axis = axis_map.get(name, 0)
        # Rows are TP-local rows: with TP on axis 0 the global row offset composes TP and G (tp-major).
        fragments = [(tp_axis, tp_rank, tp_size)] if tp_size > 1 else []
        if tp_axis == 0:
            fragments = [(0, tp_rank * g.group_size + g.row_start // g.shard_rows, tp_size * g.group_size)]
        else:
            fragments.append((0, g.row_start // g.shard_rows, g.group_size))
        prepend = len(sharded_offsets)
        sharded[key] = ShardedTensor.from_rank_offsets(
            key, param.detach(), *sharded_offsets, *[(prepend + axis, r, n) for axis, r, n in fragments],
            replica_id=(0, 0, replica))
    return sharded

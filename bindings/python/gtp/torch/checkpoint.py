"""Merging GTP-sharded state dicts (one per rank) into one full state dict loadable at any G."""
import torch

SUFFIX = "_gtp_shard"


def consolidate_state_dicts(state_dicts):
    """state_dicts: every rank's model.state_dict() from one run. Sharded weights (those with a
    `<name>_gtp_shard` offset entry) are stitched from their shards by offset; every other entry is
    taken from the first state dict (replicated over the GTP group). The result holds full TP-local
    weights without offsets: load it into a model at any G, or into a GTP-off model."""
    merged = {}
    first = state_dicts[0]
    for key, value in first.items():
        if key.endswith(SUFFIX):
            continue
        meta_key = key + SUFFIX
        if meta_key not in first:
            merged[key] = value
            continue
        rows, cols = int(first[meta_key][2]), int(first[meta_key][3])
        full = torch.empty(rows, cols, dtype=value.dtype)
        covered = torch.zeros(rows, dtype=torch.bool)
        for rank, state in enumerate(state_dicts):
            start, valid = int(state[meta_key][0]), int(state[meta_key][1])
            if (int(state[meta_key][2]), int(state[meta_key][3])) != (rows, cols):
                raise ValueError(f"{key}: rank {rank}'s shard is of a {int(state[meta_key][2])} x "
                                 f"{int(state[meta_key][3])} weight, rank 0's of {rows} x {cols}")
            full[start:start + valid] = state[key]
            covered[start:start + valid] = True
        if not bool(covered.all()):
            missing = int((~covered).sum())
            raise ValueError(f"{key}: {missing} of {rows} rows are in no shard; pass every rank's state dict")
        merged[key] = full
    return merged

"""A rank started by gtp-launch: bootstraps over UCX from GTP_RANK / GTP_WORLD_SIZE / GTP_ROOT_ADDR
(gtp.Context with no store) and checks a BF16 round trip bit for bit."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gtp  # noqa: E402

rows, cols = 40, 32
full = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
with gtp.Context() as ctx:
    assert ctx.world_size == int(os.environ["GTP_WORLD_SIZE"]) and ctx.rank == int(os.environ["GTP_RANK"])
    g = ctx.geometry(rows, cols)
    w = ctx.register("w", full[g.row_start:g.row_start + g.valid_rows].copy(), rows, cols)
    ctx.shard_updated([w])
    [bits] = ctx.materialize_arrays([w])
    exact = bool((bits == gtp.float32_to_bf16_bits(full)).all())
    ctx.release([w])
print(f"rank {ctx.rank} of {ctx.world_size}: round trip {'exact' if exact else 'WRONG'}")
sys.exit(0 if exact else 1)

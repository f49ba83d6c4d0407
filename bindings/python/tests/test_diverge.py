"""Ranks that disagree, from Python over real processes (docs/reliability.md): settings differing at
create, and ranks materializing different weights, both gtp.DivergedError on every rank."""
import numpy as np
import pytest

import gtp
from ranks import run_ranks, store_path

ROWS, COLS = 32, 64


def _create_with_depth_of_rank(rank, world, store_dir):
    try:
        gtp.Context(gtp.FileStore(store_path(store_dir)), rank, world, prefetch_depth=rank)
    except gtp.DivergedError as e:
        return str(e)
    return "created"


def test_per_rank_prefetch_depth_fails_create_on_every_rank():
    messages = run_ranks(_create_with_depth_of_rank, 3)
    for text in messages:
        assert "groups.gtp_remat.prefetch_depth: 0 on rank 0, 1 on rank 1, 2 on rank 2" in text, text


def _materialize_weight_of_rank(rank, world, store_dir, check_every_fill):
    with gtp.Context(gtp.FileStore(store_path(store_dir)), rank, world, check_every_fill=check_every_fill) as ctx:
        g = ctx.geometry(ROWS, COLS, "bf16")
        ws = [ctx.register(f"w{k}", np.full((g.valid_rows, COLS), k + 1, np.float32), ROWS, COLS, wire="bf16")
              for k in range(2)]
        ctx.shard_updated(ws)
        try:
            ctx.materialize_arrays([ws[rank]], "forward")
            ctx.release([ws[rank]])
            if check_every_fill:
                return "materialized"
            ctx.drain()  # the default: the step's check, over every gather since the last one
        except gtp.DivergedError as e:
            return str(e)
        return "drained"


def test_ranks_materializing_different_weights_fail_together_at_the_gather_with_check_every_fill():
    messages = run_ranks(_materialize_weight_of_rank, 2, True)
    for text in messages:
        assert "rank 0 gathers 'w0'" in text and "rank 1 gathers 'w1'" in text, text
        assert "gtp_materialize" in text, text


def test_ranks_materializing_different_weights_fail_together_at_drain_by_default():
    messages = run_ranks(_materialize_weight_of_rank, 2, False)
    for text in messages:
        assert "rank 0 gathers 'w0'" in text and "rank 1 gathers 'w1'" in text, text
        assert "gtp_drain" in text and "the step's check at drain" in text, text


def test_check_every_fill_must_be_a_bool():
    with pytest.raises(TypeError, match="check_every_fill=1"):
        gtp.Context(check_every_fill=1)

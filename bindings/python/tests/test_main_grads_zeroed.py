"""Main grads declared zero (gtp.torch Context.main_grads_zeroed, and gtp.torch's own declaration after each
delivery) on the host backend, through TE's DistributedWeight protocol in TE's call order (the stand-in
of test_te_protocol.py; the real TE runs on a GPU in test_te.py): the main grads equal those of the
undeclared run bit for bit, at G = 1 and G = 2, and the first grad_buffer() after a declaration is the
main grad itself on one rank."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp  # noqa: E402
import gtp.torch as gt  # noqa: E402
from ranks import run_ranks  # noqa: E402
from test_te_protocol import COLS, ROWS, TOKENS, _TEOrderLinear, _weights  # noqa: E402

STEPS, MICROBATCHES, LAYERS = 2, 3, 3


def _train(ctx, rank, declare, bucket=False):
    """STEPS optimizer-less steps of MICROBATCHES fused-wgrad backwards through LAYERS layers; each step
    starts with the main grads zeroed (and declared, if `declare`). bucket: main_grad is a caller's FP32
    tensor (a DDP bucket view), which gtp.torch's own staging feeds. Returns the last step's main grads."""
    weights = [w for _, w in _weights(ctx, LAYERS, seed=5)]
    if bucket:
        for w in weights:
            w.main_grad = torch.zeros(w.shape)
    for step in range(STEPS):
        for w in weights:
            w.main_grad.zero_()
        if declare:
            ctx.main_grads_zeroed()
        for mb in range(MICROBATCHES):
            seed = 1000 * rank + 10 * step + mb
            h = torch.randn(TOKENS, COLS, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
            for w in weights:
                h = _TEOrderLinear.apply(h, w, True, False)
            h.float().square().sum().backward()
    return [w.main_grad.clone() for w in weights], ctx.stats()["grads"]


def _store(tmp_dir, name, world=1):
    return torch.distributed.FileStore(os.path.join(str(tmp_dir), name), world)


def test_declared_main_grads_equal_the_undeclared_run_on_one_rank(tmp_path):
    with gt.Context(_store(tmp_path, "off"), 0, 1) as ctx:
        plain, plain_stats = _train(ctx, 0, declare=False)
    with gt.Context(_store(tmp_path, "on"), 0, 1) as ctx:
        declared, stats = _train(ctx, 0, declare=True)
    for a, b in zip(plain, declared):
        assert torch.equal(a, b)
    assert plain_stats["zeroed_handouts"] == 0
    # One per weight and step: the first microbatch writes into the main grad, the others add.
    assert stats["zeroed_handouts"] == STEPS * LAYERS
    assert stats["reduce_scatters"] == plain_stats["reduce_scatters"] - STEPS * LAYERS


def test_first_grad_buffer_after_a_declaration_is_the_main_grad_and_misuse_is_refused(tmp_path):
    with gt.Context(_store(tmp_path, "s"), 0, 1, auto_drain=False) as ctx:
        (_, w), = _weights(ctx, 1)
        assert w.grad_buffer().data_ptr() != w.main_grad.data_ptr(), "undeclared: libgtp's own buffer"
        with pytest.raises(gtp.InvalidStateError, match="'w0' has a grad buffer handed out.*drain first"):
            ctx.main_grads_zeroed([w])
        w.finalize_group_grads()
        with pytest.raises(gtp.InvalidStateError, match="main-grad add pending"):
            ctx.main_grads_zeroed()
        ctx.drain()
        w.main_grad.zero_()
        ctx.main_grads_zeroed([w])
        ctx.main_grads_zeroed([])  # declares nothing (not "every weight")
        buffer = w.grad_buffer()
        assert buffer.data_ptr() == w.main_grad.data_ptr()
        buffer.fill_(2.0)  # TE's write (accumulate=False)
        w.finalize_group_grads()
        ctx.drain()
        assert bool((w.main_grad == 2.0).all())
        assert ctx.stats()["grads"]["zeroed_handouts"] == 1


def test_accumulated_microbatches_write_the_first_wgrad_into_the_main_grad_and_add_the_rest(tmp_path):
    with gt.Context(_store(tmp_path, "acc"), 0, 1, accumulate_microbatches=True, auto_drain=False) as ctx:
        (_, w), = _weights(ctx, 1)
        w.main_grad.zero_()
        ctx.main_grads_zeroed([w])
        for mb, value in enumerate((2.0, 3.0)):
            buffer = w.grad_buffer()
            # the main grad, then (held with the first microbatch in it) a scratch that finalize adds
            assert (buffer.data_ptr() == w.main_grad.data_ptr()) == (mb == 0)
            buffer.fill_(value)
            w.finalize_group_grads(last_microbatch=mb == 1)
        ctx.drain()
        assert bool((w.main_grad == 5.0).all())
        assert ctx.stats()["grads"]["zeroed_handouts"] == 1 and ctx.stats()["grads"]["reduce_scatters"] == 0


def test_a_caller_main_grad_is_fed_from_a_staging_declared_zero_after_each_delivery(tmp_path):
    """A main_grad the caller assigned (Megatron DDP's bucket view): gtp.torch zeroes its staging at each
    delivery and declares it, so every microbatch but the very first writes the wgrad into the staging
    with no libgtp add; the caller's main grads are those of the plain run bit for bit."""
    with gt.Context(_store(tmp_path, "plain"), 0, 1) as ctx:
        plain, _ = _train(ctx, 0, declare=False)
    with gt.Context(_store(tmp_path, "bucket"), 0, 1) as ctx:
        fed, stats = _train(ctx, 0, declare=False, bucket=True)
    for a, b in zip(plain, fed):
        assert torch.equal(a, b)
    assert stats["zeroed_handouts"] == (STEPS * MICROBATCHES - 1) * LAYERS


def _two_ranks(rank, world, store_dir):
    grads = []
    for declare in (False, True):
        with gt.Context(_store(store_dir, f"store{int(declare)}", world), rank, world) as ctx:
            grads.append(_train(ctx, rank, declare))
    return grads


def test_declared_main_grads_equal_the_undeclared_run_on_two_ranks(tmp_path):
    for (plain, plain_stats), (declared, stats) in run_ranks(_two_ranks, 2):
        for a, b in zip(plain, declared):
            assert torch.equal(a, b)
        assert plain_stats["zeroed_copies"] == 0 and stats["zeroed_handouts"] == 0
        assert stats["zeroed_copies"] == STEPS * LAYERS  # the reduced rows copied, not added
        assert stats["reduce_scatters"] == plain_stats["reduce_scatters"]

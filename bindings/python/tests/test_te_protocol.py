"""TE's DistributedWeight contract on the host backend, without TE (TE needs CUDA; tests/test_te.py runs
the real TE layers on a GPU). `_TEOrderLinear` is a stand-in for te.Linear's calls, named so: the same
protocol calls in the same order (materialize without release, the wgrad written into grad_buffer()
with fuse_wgrad_accumulation or passed to finalize without it), and LayerNormLinear's habit of keeping
the forward materialization in ctx."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gtp  # noqa: E402
import gtp.torch as gt  # noqa: E402
from ranks import rank_threads, run_ranks, store_path  # noqa: E402

ROWS = COLS = 48  # square, so layers chain
TOKENS = 8


class _TEOrderLinear(torch.autograd.Function):
    """y = x W^T in TE 2.20 Linear's protocol order (module/linear.py): forward materializes and never
    releases; backward re-materializes, computes dgrad, then the wgrad (into grad_buffer() when fused,
    else a new tensor in the activation dtype) and finalizes it; with the fused path and no
    grad_added_to_main_grad attribute TE returns no weight grad."""

    @staticmethod
    def forward(ctx, x, weight, fuse, keep_in_ctx):
        full = gt.materialize_weight_for_forward([weight])[0]
        ctx.requires_wgrad = full.requires_grad  # LayerNormLinear reads it from the materialized tensor
        if keep_in_ctx:
            ctx.kept = full  # LayerNormLinear's ctx.weight: kept, never read again
        ctx.save_for_backward(x)
        ctx.weight, ctx.fuse = weight, fuse
        return x.matmul(full.t())

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        full = gt.materialize_weight_for_backward([weight])[0]
        grad_in = grad_out.matmul(full)
        wgrad = None
        if ctx.requires_wgrad:
            if ctx.fuse:
                buffer = weight.grad_buffer()
                torch.mm(grad_out.t().float(), x.float(), out=buffer)  # accumulate=False into grad_buffer()
                returned = gt.finalize_weight_grads([weight], [buffer])
            else:
                returned = gt.finalize_weight_grads([weight], [grad_out.t().matmul(x)])
            assert returned == [None], "an asynchronous finalize: TE's dispatcher wraps None as [None]"
            wgrad = None if ctx.fuse and not hasattr(weight, "grad_added_to_main_grad") else returned[0]
        return grad_in, wgrad, None, None


def _weights(ctx, n, seed=0, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    out = []
    for i in range(n):
        full = (torch.randn(ROWS, COLS) * 0.1).to(dtype)
        g = ctx.geometry(ROWS, COLS)
        w = gt.ShardedParameter(full[g.row_start:g.row_start + g.valid_rows].clone(), ctx, f"w{i}", ROWS, COLS)
        ctx.shard_updated([w])
        out.append((full, w))
    return out


def _group_stats(ctx):
    return next(g for g in ctx.stats()["groups"] if g["name"] == "gtp_remat")


@pytest.mark.parametrize("keep_in_ctx", [False, True], ids=["linear", "layernorm_linear"])
def test_uses_end_without_release_and_the_cache_stays_within_depth_plus_one(tmp_path, keep_in_ctx):
    depth, layers = 2, 6
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, prefetch_depth=depth) as ctx:
        pairs = _weights(ctx, layers)
        plain = [full.clone().requires_grad_() for full, _ in pairs]
        optimizer = torch.optim.SGD([w for _, w in pairs], lr=0.01)
        plain_optimizer = torch.optim.SGD(plain, lr=0.01)
        ctx.attach_optimizer(optimizer)
        slots = []
        for step in range(24):
            x = torch.randn(TOKENS, COLS, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16)
            h, h_plain = x, x
            for (_, w), p in zip(pairs, plain):
                h = _TEOrderLinear.apply(h, w, False, keep_in_ctx)
                h_plain = h_plain.matmul(p.t())
            assert torch.equal(h, h_plain), f"step {step}: a slot was refilled while its weight was in use"
            h.float().square().mean().backward()  # pulls the weights towards 0: finite over every step
            h_plain.float().square().mean().backward()
            for (_, w), p in zip(pairs, plain):
                assert torch.equal(w.grad, p.grad), step
            optimizer.step()
            plain_optimizer.step()
            optimizer.zero_grad()
            plain_optimizer.zero_grad()
            slots.append(_group_stats(ctx)["slots"])
        assert max(slots) <= depth + 1, slots
        assert len(set(slots[2:])) == 1, f"the cache still grows after warm-up: {slots}"
        assert ctx.stats()["materialize"]["calls"] == 24 * 2 * layers


def test_grads_arrive_as_te_without_gtp_gives_them(tmp_path):
    """fuse off: .grad in the parameter's dtype, added up over microbatches exactly as autograd adds
    them; fuse on: main_grad (FP32) accumulates until zeroed, .grad stays None; a main_grad the caller
    assigned (BF16 here, a DDP bucket's dtype) receives the gradient instead."""
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as ctx:
        (full, w), = _weights(ctx, 1)
        assert not hasattr(w, "grad_added_to_main_grad"), "TE would return an uninitialised dummy grad"
        plain = full.clone().requires_grad_()
        xs = [torch.randn(TOKENS, COLS, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
              for i in range(3)]
        for x in xs:  # fuse off, three microbatches (three drains)
            _TEOrderLinear.apply(x, w, False, False).float().sum().backward()
            x.matmul(plain.t()).float().sum().backward()
        assert w.grad.dtype == torch.bfloat16 and torch.equal(w.grad, plain.grad)
        assert bool((w.main_grad == 0).all())
        w.grad = None
        fused = torch.zeros(ROWS, COLS)
        for x in xs:  # fuse on: FP32 wgrads summed in main_grad
            _TEOrderLinear.apply(x, w, True, False).float().sum().backward()
            fused += torch.ones(TOKENS, ROWS).t().matmul(x.float())
        assert w.grad is None and torch.equal(w.main_grad, fused)
        w.main_grad.zero_()
        bucket = torch.zeros(ROWS, COLS, dtype=torch.bfloat16)
        w.main_grad = bucket
        assert w.main_grad is bucket
        _TEOrderLinear.apply(xs[0], w, True, False).float().sum().backward()
        assert torch.equal(bucket, torch.ones(TOKENS, ROWS).t().matmul(xs[0].float()).to(torch.bfloat16))
        with pytest.raises(ValueError, match="main_grad of 'w0' must be an FP32 or BF16 tensor"):
            w.main_grad = torch.zeros(ROWS, COLS + 1)


def test_dispatchers_and_expert_groups_follow_te(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as ctx:
        leader = gt.ShardedParameter(torch.zeros(ROWS, COLS), ctx, "e0", ROWS, COLS, group="expert_gtp_remat")
        experts = [leader] + [gt.ShardedParameter(torch.full((ROWS, COLS), float(i)), ctx, f"e{i}", ROWS, COLS,
                                                  group="expert_gtp_remat", expert_leader=leader) for i in (1, 2)]
        experts[2].requires_grad_(False)
        ctx.shard_updated([leader])
        assert all(e.is_routed_expert and e.weight_list is leader.group_members for e in experts)
        fulls = gt.materialize_weight_for_forward(experts)
        assert len(fulls) == 3 and [f[0, 0].item() for f in fulls] == [0.0, 1.0, 2.0]
        assert [f.requires_grad for f in fulls] == [True, True, False], "requires_grad as the parameter's"
        wgrads = [torch.ones(ROWS, COLS)] * 3
        assert gt.finalize_weight_grads(experts, wgrads) == [None] * 3, "one entry per expert"
        ctx.drain()
        assert all(torch.equal(e.grad, torch.ones(ROWS, COLS)) for e in experts)
        plain = torch.ones(2, 2)
        assert gt.materialize_weight_for_forward(plain) == [plain]
        assert gt.finalize_weight_grads([plain], [plain]) == [plain]

        class Flagged:
            is_distributed_weight = True
        with pytest.raises(TypeError, match="torch.Tensor subclasses"):
            gt.is_distributed_weight(Flagged())
        single = gt.ShardedParameter(torch.zeros(ROWS, COLS), ctx, "single", ROWS, COLS)
        ctx.shard_updated([single])
        assert not single.is_routed_expert and single.weight_list is None


def test_release_group_ends_a_use_early_once(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as ctx:
        (_, w), = _weights(ctx, 1)
        w.materialize_group_for_forward()
        w.release_group()
        with pytest.raises(gtp.InvalidStateError, match="not materialized"):
            w.release_group()
        w.materialize_group_for_forward()
        w.materialize_group_for_forward()  # ends the first use itself: no second slot is held
        ctx.drain()
        with pytest.raises(gtp.InvalidStateError, match="not materialized"):
            w.release_group()


def _two_rank_te_order(rank, world, store_dir):
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world, prefetch_depth=1)
    pairs = _weights(ctx, 4, seed=3)
    slots, grads = [], []
    for step in range(20):
        x = torch.randn(TOKENS, COLS, generator=torch.Generator().manual_seed(100 * rank + step)).to(torch.bfloat16)
        h = x
        for _, w in pairs:
            h = _TEOrderLinear.apply(h, w, True, True)
        h.float().sum().backward()
        slots.append(_group_stats(ctx)["slots"])
    grads = [w.main_grad.clone() for _, w in pairs]
    g = pairs[0][1].geometry
    ctx.close()
    return slots, grads, g.row_start, g.valid_rows, [full for full, _ in pairs]


def test_two_ranks_bounded_and_reduced(tmp_path):
    results = run_ranks(_two_rank_te_order, 2)
    fulls = results[0][4]
    with rank_threads():
        per_rank = []
        for rank in range(2):
            total = [torch.zeros(ROWS, COLS) for _ in fulls]
            for step in range(20):
                x = torch.randn(TOKENS, COLS, generator=torch.Generator().manual_seed(100 * rank + step))
                h, acts = x.to(torch.bfloat16), []
                for full in fulls:
                    acts.append(h)
                    h = h.matmul(full.t())
                g_out = torch.ones(TOKENS, ROWS, dtype=torch.bfloat16)
                for i in reversed(range(len(fulls))):
                    total[i] += g_out.t().float().matmul(acts[i].float())
                    g_out = g_out.matmul(fulls[i])
            per_rank.append(total)
    for slots, grads, start, rows, _ in results:
        assert max(slots) <= 2, slots
        for i, grad in enumerate(grads):
            mean = (per_rank[0][i] + per_rank[1][i]) / 2
            torch.testing.assert_close(grad, mean[start:start + rows], rtol=1e-5, atol=1e-5)

"""gtp.torch over the host backend: GroupedLinear (MoE experts as one expert group) against the unsharded
layer, the GEMM-layout views as tensors, and the optimizer step's head re-gather."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import gtp  # noqa: E402
import gtp.torch as gt  # noqa: E402
from ranks import run_ranks, store_path  # noqa: E402

EXPERTS, IN, OUT = 3, 64, 40  # OUT not a multiple of 16 x G: the last shards are padding
M_SPLITS = [4, 0, 3]  # an expert without tokens still takes part in the group's collectives


def _grouped(rank, world, store_dir):
    ctx = gt.Context(torch.distributed.FileStore(store_path(store_dir), world), rank, world)
    torch.manual_seed(4)
    sharded = gt.GroupedLinear(EXPERTS, IN, OUT, context=ctx)
    torch.manual_seed(4)
    plain = gt.GroupedLinear(EXPERTS, IN, OUT)
    ready = []
    for w in sharded.weights():
        w.register_grad_ready_hook(ready.append)
    x = torch.randn(sum(M_SPLITS), IN, generator=torch.Generator().manual_seed(30 + rank))
    x_sharded, x_plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    scale = torch.randn(sum(M_SPLITS), OUT, generator=torch.Generator().manual_seed(60 + rank))
    y_sharded, y_plain = sharded(x_sharded, M_SPLITS), plain(x_plain, M_SPLITS)
    (y_sharded * scale).sum().backward()  # drains at the end (auto_drain)
    (y_plain * scale).sum().backward()
    stats = ctx.stats()
    errors = []
    for call in (lambda: sharded(x, [4, 3]), lambda: sharded.weight0.finalize_group_grads([None])):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    result = {"geometry": sharded.weight0.geometry, "y_equal": torch.equal(y_sharded, y_plain),
              "x_grad_equal": torch.equal(x_sharded.grad, x_plain.grad),
              "shard_grads": [w.grad.clone() for w in sharded.weights()],
              "plain_wgrads": [w.grad.clone() for w in plain.weights()],
              "bias_grads_equal": all(torch.equal(getattr(sharded, f"bias{i}").grad, getattr(plain, f"bias{i}").grad)
                                      for i in range(EXPERTS)),
              "ready": [w.gtp_weight.name for w in ready], "calls": stats["materialize"]["calls"],
              "reduce_scatters": stats["grads"]["reduce_scatters"], "errors": errors,
              "group_size": ctx.group_size("expert_gtp_remat")}
    ctx.close()
    return result


@pytest.mark.parametrize("world", [2, 4])
def test_grouped_linear_matches_the_unsharded_experts(world):
    results = run_ranks(_grouped, world)
    g0 = results[0]["geometry"]
    for e in range(EXPERTS):
        padded = [np.pad(r["plain_wgrads"][e].numpy(), ((0, g0.padded_rows - OUT), (0, 0))) for r in results]
        reference = torch.from_numpy(gtp.ring_mean(padded, g0.shard_rows))
        for r in results:
            g = r["geometry"]
            assert torch.equal(r["shard_grads"][e], reference[g.row_start:g.row_start + g.valid_rows]), e
    for r in results:
        assert r["group_size"] == world
        assert r["y_equal"] and r["x_grad_equal"] and r["bias_grads_equal"], "bit for bit with the unsharded experts"
        assert r["calls"] == 2, "one materialize for the whole group in forward, one in backward"
        assert sorted(r["ready"]) == [f"grouped0.weight{e}" for e in range(EXPERTS)]
        assert "m_splits" in r["errors"][0] and "one per member" in r["errors"][1]
    assert sum(r["geometry"].valid_rows for r in results) == OUT


def test_grouped_views_are_tensors_aliasing_the_sections(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, machinery_at_g1=True) as ctx:
        layer = gt.GroupedLinear(2, IN, OUT, bias=False, context=ctx, wire="fp8")
        views = layer.weight0.materialize_group_views("forward", layout="gemm")
        full = layer.weight0.materialize_group_for_forward()  # the BF16 layout, held alongside
        assert [v.weight.user for v in views] == layer.weights()
        for view in views:
            assert view.layout == "gemm" and set(view.sections()) == {"data", "data_t", "decode_scales"}
            for section in view.sections().values():
                t = section.tensor
                assert t.data_ptr() == section.address and tuple(t.shape) == section.array.shape
                np.testing.assert_array_equal(t.numpy(), section.array)
            assert view.data.tensor.dtype == torch.uint8 and view.decode_scales.tensor.dtype == torch.float32
            assert torch.equal(view.data_t.tensor, view.data.tensor.t())
        # codes x decode scale, rounded to BF16, is the BF16 layout (FP8: E4M3 codes as torch's float8).
        decoded = views[1].data.tensor.view(torch.float8_e4m3fn).float()[:OUT] * views[1].decode_scales.tensor[0, 0]
        assert torch.equal(decoded.to(torch.bfloat16), full[1])
        with pytest.raises(gtp.InvalidStateError, match="both the BF16 and the GEMM layout"):
            layer.weight0.release_group()
        layer.weight0.release_group("gemm")
        layer.weight0.release_group()


@pytest.mark.parametrize("microbatches", [0, 1, 2])
def test_the_head_is_gathered_once_per_step_when_the_optimizer_is_attached(tmp_path, microbatches):
    """With attach_optimizer(.., microbatches=N) the drain ending each optimizer step defers the next
    step's head (depth entries) to the optimizer hook's shard_updated: gathered once, from the updated
    shards (stale_prefetches stays 0), while the other drains keep prefetching it. Without (0: plain
    drains, re-pack called by hand) drain prefetches the head from the old shards and shard_updated
    re-gathers it (stale_prefetches += depth per step). All correct; the head is always prefetched."""
    depth = 2
    backwards = max(microbatches, 1)
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    prefetch_depth=depth, machinery_at_g1=True) as ctx:
        torch.manual_seed(6)
        sharded = torch.nn.Sequential(*[gt.Linear(IN, IN, context=ctx) for _ in range(3)])
        torch.manual_seed(6)
        plain = torch.nn.Sequential(*[gt.Linear(IN, IN) for _ in range(3)])
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (sharded, plain)]
        if microbatches:
            ctx.attach_optimizer(optimizers[0], microbatches=microbatches)
        stale = []
        for step in range(3):
            for micro in range(backwards):
                x = torch.randn(4, IN, generator=torch.Generator().manual_seed(10 * step + micro))
                outputs = [m(x) for m in (sharded, plain)]
                assert torch.equal(outputs[0], outputs[1]), f"step {step}: the head holds the updated weights"
                for out in outputs:
                    out.square().sum().backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            if not microbatches:
                ctx.shard_updated()
            stale.append(ctx.stats()["materialize"]["stale_prefetches"])
        counters = ctx.stats()["materialize"]
        assert stale == ([0, 0, 0] if microbatches else [depth, 2 * depth, 3 * depth])
        # The first drain period (one backward) records; every later consume is a prefetch hit.
        assert counters["exposed_gathers"] == 6, counters
        assert counters["prefetch_hits"] == 6 * (3 * backwards - 1), counters
    with pytest.raises(ValueError, match="microbatches=0"):
        ctx.attach_optimizer(optimizers[0], microbatches=0)


def test_keep_gathered_from_the_profile_gathers_each_weight_once_per_optimizer_step(tmp_path):
    """A profile with keep_gathered on the dense group: each optimizer step (two microbatches, the
    optimizer attached) gathers each of the three weights once, every other consume reads its kept
    slot, and every output equals the unsharded model's as the weights change."""
    import json
    profile = json.dumps({"schema_version": 1, "cluster": {"template": {"host_count": 1, "host": {
        "numa_nodes": [{"os_index": 0, "cpuset": "0x1"}], "gpus": [{"index": 0, "numa_node": 0}]}}},
        "parallel": {"world_size": 1},
        "groups": {"gtp_remat": {"prefetch_depth": 2, "keep_gathered": True}}})
    steps, microbatches, layers = 3, 2, 3
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    profile_json=profile, machinery_at_g1=True) as ctx:
        torch.manual_seed(7)
        sharded = torch.nn.Sequential(*[gt.Linear(IN, IN, context=ctx) for _ in range(layers)])
        torch.manual_seed(7)
        plain = torch.nn.Sequential(*[gt.Linear(IN, IN) for _ in range(layers)])
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (sharded, plain)]
        ctx.attach_optimizer(optimizers[0], microbatches=microbatches)
        for step in range(steps):
            for micro in range(microbatches):
                x = torch.randn(4, IN, generator=torch.Generator().manual_seed(10 * step + micro))
                outputs = [m(x) for m in (sharded, plain)]
                assert torch.equal(outputs[0], outputs[1]), f"step {step}, microbatch {micro}"
                for out in outputs:
                    out.square().sum().backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
        stats = ctx.stats()
        counters = stats["materialize"]
        assert stats["groups"][0]["keep_gathered"] is True
        assert counters["calls"] == steps * 2 * microbatches * layers, counters
        # One gather per weight and step: the recording step's on demand, later ones prefetched (the
        # head by the optimizer hook's re-pack); the other three consumes of each weight read its slot.
        assert counters["exposed_gathers"] == layers, counters
        assert counters["prefetch_hits"] == (steps - 1) * layers, counters
        assert counters["kept_hits"] == steps * (2 * microbatches - 1) * layers, counters
        assert counters["stale_prefetches"] == 0, counters


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA backend test needs a GPU")
def test_cuda_grouped_linear_and_gemm_views_on_one_gpu(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1,
                    backend="cuda", machinery_at_g1=True) as ctx:
        torch.manual_seed(5)
        sharded = gt.GroupedLinear(EXPERTS, IN, OUT, context=ctx)
        torch.manual_seed(5)
        plain = gt.GroupedLinear(EXPERTS, IN, OUT, device="cuda")
        x = torch.randn(sum(M_SPLITS), IN, device="cuda")
        assert torch.equal(sharded(x, M_SPLITS), plain(x, M_SPLITS))
        sharded(x, M_SPLITS).sum().backward()
        plain(x, M_SPLITS).sum().backward()
        torch.cuda.synchronize()
        for a, b in zip(sharded.weights(), plain.weights()):
            assert torch.equal(a.grad, b.grad)
        quantized = gt.GroupedLinear(2, IN, OUT, bias=False, context=ctx, wire="fp8")
        views = quantized.weight0.materialize_group_views("forward", layout="gemm")
        full = quantized.weight0.materialize_group_for_forward()
        for view, weight in zip(views, full):
            data, scale = view.data.tensor, view.decode_scales.tensor
            assert data.is_cuda and data.dtype == torch.uint8 and data.data_ptr() == view.data.address
            assert torch.equal(view.data_t.tensor, data.t())
            decoded = data.view(torch.float8_e4m3fn).float()[:OUT] * scale[0, 0]
            assert torch.equal(decoded.to(torch.bfloat16), weight)
        quantized.weight0.release_group("gemm")
        quantized.weight0.release_group()
        torch.cuda.synchronize()

"""gtp.torch over the host backend: DistributedWeight protocol, Linear gradients against a
single-process reference, tiny-model parity, checkpoint re-sharding G=4 -> G=2. One-rank tests ask
for the machinery (machinery_at_g1=True); the inert default at G = 1 is test_g1_inert.py's."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import gtp  # noqa: E402
import gtp.torch as gt  # noqa: E402
from ranks import rank_threads, run_ranks, store_path  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
IN, OUT = 64, 40  # OUT not a multiple of 16 x G: the last shards are padding


def torch_context(rank, world, store_dir, **kwargs):
    store = torch.distributed.FileStore(store_path(store_dir), world)
    return gt.Context(store, rank, world, **kwargs)


def _linear_grads(rank, world, store_dir):
    ctx = torch_context(rank, world, store_dir)
    torch.manual_seed(3)
    sharded = gt.Linear(IN, OUT, context=ctx)
    torch.manual_seed(3)
    plain = gt.Linear(IN, OUT)
    ready = []
    sharded.weight.register_grad_ready_hook(ready.append)
    x = torch.randn(6, IN, generator=torch.Generator().manual_seed(50 + rank))
    x_sharded, x_plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.randn(6, OUT, generator=torch.Generator().manual_seed(90 + rank))
    y_sharded, y_plain = sharded(x_sharded), plain(x_plain)
    (y_sharded * weights).sum().backward()  # drains at the end (auto_drain)
    (y_plain * weights).sum().backward()
    protocol = (gt.is_distributed_weight(sharded.weight), gt.is_distributed_weight(plain.weight),
                gt.materialize_weight_for_forward([plain.weight])[0] is plain.weight)
    result = {"geometry": sharded.weight.geometry, "shard_grad": sharded.weight.grad.clone(),
              "main_grad_zeroed": bool((sharded.weight.main_grad == 0).all()), "ready": len(ready),
              "y_equal": torch.equal(y_sharded, y_plain), "x_grad_equal": torch.equal(x_sharded.grad, x_plain.grad),
              "plain_wgrad": plain.weight.grad.clone(), "protocol": protocol,
              "drain_stats": ctx.stats()["grads"]}
    ctx.close()
    return result


@pytest.mark.parametrize("world", [2, 4])
def test_linear_gradients_match_the_single_process_reference(world):
    results = run_ranks(_linear_grads, world)
    g0 = results[0]["geometry"]
    padded = [np.pad(r["plain_wgrad"].numpy(), ((0, g0.padded_rows - OUT), (0, 0))) for r in results]
    reference = torch.from_numpy(gtp.ring_mean(padded, g0.shard_rows))
    for r in results:
        g = r["geometry"]
        assert r["y_equal"] and r["x_grad_equal"], "forward and dgrad equal the unsharded layer's bit for bit"
        assert torch.equal(r["shard_grad"], reference[g.row_start:g.row_start + g.valid_rows])
        assert r["main_grad_zeroed"] and r["ready"] == 1
        assert r["protocol"] == (True, False, True)
    assert sum(r["geometry"].valid_rows for r in results) == OUT


def test_linear_passes_the_block_shape_and_the_scale_rounding_to_the_wire(tmp_path):
    """gt.Linear(wire="nvfp4", nvfp4_2d=True) registers 16x16 blocks: its GEMM view carries the exact
    transpose; wire="mxfp8" with mx_rounding="floor" materializes the OCP rule, which differs from RCEIL
    on 1.875 (RCEIL keeps it, FLOOR saturates it to 1.75)."""
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, machinery_at_g1=True) as ctx:
        nvfp4 = gt.Linear(IN, 32, context=ctx, bias=False, wire="nvfp4", nvfp4_2d=True)
        assert nvfp4.weight.gtp_weight.nvfp4_2d
        views = ctx.materialize_views([nvfp4.weight.gtp_weight], layout="gemm")
        assert views[0].data_t is not None and views[0].scales_t is not None
        assert views[0].scale_layout == "row_major"
        ctx.release([nvfp4.weight.gtp_weight], layout="gemm")
        # gemm_scales reaches the wire: blocked 128x4 scale sections, whole tiles, as tensors too.
        blocked = gt.Linear(IN, 32, context=ctx, bias=False, wire="nvfp4", nvfp4_2d=True, gemm_scales="blocked_128x4")
        [view] = ctx.materialize_views([blocked.weight], layout="gemm")
        assert view.scale_layout == "blocked_128x4" and view.scale_block == (1, 16)
        assert tuple(view.scales.tensor.shape) == (128, 4)  # 32 rows x IN/16 scales, padded to one tile
        assert view.scales_t.rows % 128 == 0 and view.scales_t.cols % 4 == 0
        ctx.release([blocked.weight], layout="gemm")
        results = {}
        for rounding in ("rceil", "floor"):
            layer = gt.Linear(IN, 32, context=ctx, bias=False, wire="mxfp8", mx_rounding=rounding)
            assert layer.weight.gtp_weight.mx_rounding == rounding
            with torch.no_grad():
                layer.weight.fill_(1.875)
            ctx.shard_updated([layer.weight])
            results[rounding] = layer.weight.materialize_group_for_forward().float()
            layer.weight.release_group()
        assert bool((results["rceil"] == 1.875).all()) and bool((results["floor"] == 1.75).all())


def test_tcpstore_bootstrap_and_protocol_on_one_rank():
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True)
    with gt.Context(store, 0, 1, machinery_at_g1=True) as ctx:
        layer = gt.Linear(IN, OUT, context=ctx, bias=False)
        w = layer.weight
        assert isinstance(w, torch.nn.Parameter) and w.is_distributed_weight
        full = w.materialize_group_for_forward()
        assert full.dtype == torch.bfloat16 and tuple(full.shape) == (OUT, IN)
        assert torch.equal(full, w.detach().to(torch.bfloat16))
        w.release_group()
        buffer = w.grad_buffer()  # TE's wgrad GEMM overwrites it: no zero-fill, contents undefined
        assert buffer.dtype == torch.float32 and tuple(buffer.shape) == (OUT, IN)
        assert w.grad_buffer() is buffer, "repeated calls before finalize hand out the same tensor"
        buffer.fill_(2.0)
        assert w.finalize_group_grads() is None  # asynchronous, as TE allows
        ctx.drain()
        # Written into grad_buffer() (TE's fuse_wgrad_accumulation): it lands in main_grad, .grad untouched.
        assert bool((w.main_grad == 2.0).all()) and w.grad is None
        assert not hasattr(w, "grad_added_to_main_grad"), "TE would return its uninitialised dummy grad"
        with pytest.raises(gtp.InvalidStateError, match="not materialized"):
            w.release_group()


# The CPU (host backend) and CUDA (NCCL, one GPU) forms of the same test: ids "cpu" and "cuda".
BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: the CUDA backend form needs a GPU")),
]


def _context(store, device, **kwargs):
    """One rank with the machinery on (machinery_at_g1=True): these tests are about libgtp's own path."""
    return gt.Context(store, 0, 1, backend="cuda" if device == "cuda" else "host", machinery_at_g1=True, **kwargs)


@pytest.mark.parametrize("device", BACKENDS)
def test_te_protocol_grad_buffer_is_overwritten_and_microbatches_still_accumulate(tmp_path, device):
    """TE writes its wgrad into grad_buffer() (accumulate=False). With accumulate_microbatches the
    weight's libgtp buffer is held across microbatches, so the second microbatch must get a scratch
    tensor whose wgrad is added, not written over the first."""
    for accumulate in (False, True):
        store = torch.distributed.FileStore(str(tmp_path / f"store{int(accumulate)}"), 1)
        with _context(store, device, accumulate_microbatches=accumulate, auto_drain=False) as ctx:
            w = gt.Linear(IN, OUT, context=ctx, bias=False).weight
            assert w.device.type == device
            targets = []
            for microbatch, value in enumerate((2.0, 3.0)):
                target = w.grad_buffer()
                held, _ = w.wgrad_buffer(separate=True)
                # libgtp's buffer itself (no scratch) unless it holds an earlier microbatch
                assert (target.data_ptr() == held.data_ptr()) == (microbatch == 0 or not accumulate)
                target.fill_(value)  # TE's GEMM with accumulate=False: whatever was there is gone
                targets.append(target.data_ptr())
                w.finalize_group_grads(last_microbatch=microbatch == 1)
            ctx.drain()
            # Written into grad_buffer(), as TE's fused accumulation: main_grad holds the sum, .grad is untouched.
            assert bool((w.main_grad == 5.0).all()) and w.grad is None, (accumulate, w.main_grad)
            # TE's grad_buffer() asks for a separate buffer: libgtp's own, reduced, even on one rank
            assert ctx.stats()["grads"]["reduce_scatters"] == (1 if accumulate else 2)
            assert ctx.stats()["grads"]["into_main_grad"] == 0
            if accumulate:
                assert targets[0] != targets[1], "the held buffer was handed out to be overwritten"


@pytest.mark.parametrize("device", BACKENDS)
def test_layers_accumulate_microbatches_and_reduce_once_per_step(tmp_path, device):
    """accumulate_microbatches + attach_optimizer(microbatches=2): gtp.torch.Linear writes the first
    microbatch's wgrad, adds the second, and reduce-scatters once per step; .grad arrives at the
    step's last drain and equals autograd's sum over the microbatches."""
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    with _context(store, device, accumulate_microbatches=True) as ctx:
        torch.manual_seed(11)
        sharded = gt.Linear(IN, OUT, context=ctx, bias=False)
        torch.manual_seed(11)
        plain = gt.Linear(IN, OUT, bias=False, device=device)
        ready = []
        sharded.weight.register_grad_ready_hook(ready.append)
        ctx.attach_optimizer(torch.optim.SGD(sharded.parameters(), lr=0.0), microbatches=2)
        for step in range(2):
            for microbatch in range(2):
                x = torch.randn(5, IN, generator=torch.Generator().manual_seed(10 * step + microbatch)).to(device)
                sharded(x).square().sum().backward()
                plain(x).square().sum().backward()
                if microbatch == 0:
                    assert sharded.weight.grad is None and not ready, "reduced before the step's last microbatch"
            assert torch.equal(sharded.weight.grad, plain.weight.grad), step
            assert ready == [sharded.weight]
            ready.clear()
            sharded.weight.grad = None
            plain.weight.grad = None
        assert ctx.stats()["grads"]["into_main_grad"] == 2, "one reduction (on one rank: none) per weight per step"


def test_tiny_gpt_gtp_on_bf16_is_bit_identical_to_gtp_off():
    import train_gpt
    config = train_gpt.default_config(steps=4, wires=["bf16", "nvfp4"], layers=1, backend="host")
    summary = train_gpt.summarize(train_gpt.launch(2, config, timeout_s=400), config)
    assert summary["runs"]["bf16"]["bit_identical_to_off"], summary["runs"]
    assert summary["runs"]["nvfp4"]["within_bound"] and not summary["runs"]["nvfp4"]["bit_identical_to_off"]
    assert summary["runs"]["bf16"]["stats"]["grads"]["reduce_scatters"] > 0


def test_tiny_gpt_with_weights_kept_gathered_is_still_bit_identical_to_gtp_off():
    """train_gpt.py --keep-gathered: the BF16 run reads the backward's weights from the forward's kept
    slots, re-packed after every optimizer step, and its losses still equal GTP off's bit for bit."""
    import train_gpt
    config = train_gpt.default_config(steps=3, wires=["bf16"], layers=1, backend="host", keep_gathered=True)
    summary = train_gpt.summarize(train_gpt.launch(2, config, timeout_s=400), config)
    run = summary["runs"]["bf16"]
    assert run["bit_identical_to_off"], summary["runs"]
    counters = run["stats"]["materialize"]
    assert counters["kept_hits"] > 0 and counters["stale_prefetches"] == 0, counters
    # Each weight is consumed twice a step (forward, backward) and gathered once: half the consumes
    # read a kept slot (without keep_gathered, none).
    assert 2 * counters["kept_hits"] == counters["calls"], counters


def test_tiny_gpt_with_fill_graphs_is_still_bit_identical_to_gtp_off():
    """train_gpt.py --fill-graphs: every prefetch after the first steps is a launch of a recorded fill
    (the host backend records a fill's calls and makes them again), and the BF16 losses still equal
    GTP off's bit for bit, the FP8 ones within their bound."""
    import train_gpt
    config = train_gpt.default_config(steps=4, wires=["bf16", "fp8"], layers=1, backend="host", fill_graphs=64)
    summary = train_gpt.summarize(train_gpt.launch(2, config, timeout_s=400), config)
    assert summary["runs"]["bf16"]["bit_identical_to_off"], summary["runs"]
    assert summary["runs"]["fp8"]["within_bound"], summary["runs"]
    for wire in ("bf16", "fp8"):
        dense = summary["runs"][wire]["stats"]["groups"][0]
        assert dense["fill_graphs_limit"] == 64, dense
        assert dense["graph_fills"] > 2 * dense["graph_recordings"] > 0, dense


def test_gpt_example_checkpoint_resumes_at_half_the_ranks(tmp_path):
    """train_gpt.py --reshard-to: G = 2's BF16 checkpoint, merged, resumed at G = 1 GTP on and off."""
    import train_gpt
    config = train_gpt.default_config(steps=3, wires=["bf16"], layers=1, backend="host",
                                      checkpoint_dir=str(tmp_path), reshard_steps=2, machinery_at_g1=True)
    summary = train_gpt.summarize(train_gpt.launch(2, config, timeout_s=400), config)
    resumed = train_gpt.summarize_reshard(train_gpt.reshard(2, config, 1), config, 2, 1)
    assert resumed["shards_match_checkpoint"] and resumed["bit_identical_to_off"], resumed
    assert len(resumed["on_losses"]) == 2
    # Resumed from the trained weights, not from the initial ones: below the first step's loss.
    assert resumed["off_losses"][0] < summary["runs"]["off"]["first_loss"], (resumed, summary["runs"]["off"])


def _model(context):
    torch.manual_seed(11)
    return torch.nn.Sequential(gt.Linear(IN, OUT, context=context), torch.nn.GELU(), torch.nn.Linear(OUT, 16))


def _save_at_g4(rank, world, store_dir):
    ctx = torch_context(rank, world, store_dir)
    model = _model(ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.attach_optimizer(optimizer)
    x = torch.randn(8, IN, generator=torch.Generator().manual_seed(rank))
    model(x).square().mean().backward()
    for p in model.parameters():  # replicated parameters stay as built (no data-parallel mean here)
        if not isinstance(p, gt.ShardedParameter):
            p.grad = None
    optimizer.step()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    materialized = model[0].weight.materialize_group_for_forward().clone()
    model[0].weight.release_group()
    ctx.close()
    return state, materialized


def _load_at_g2(rank, world, store_dir, full_state, g4_rank3_state):
    ctx = torch_context(rank, world, store_dir)
    model = _model(ctx)
    model.load_state_dict(full_state)
    g = model[0].weight.geometry
    materialized = model[0].weight.materialize_group_for_forward().clone()
    model[0].weight.release_group()
    error = None
    try:
        model.load_state_dict(g4_rank3_state)
    except RuntimeError as e:
        error = str(e)
    x = torch.randn(5, IN, generator=torch.Generator().manual_seed(77))
    y = model(x).detach()
    ctx.close()
    return g, model[0].weight.detach().clone(), materialized, error, y


def test_checkpoint_written_at_g4_loads_at_g2():
    saved = run_ranks(_save_at_g4, 4)
    states = [s for s, _ in saved]
    assert all("0.weight_gtp_shard" in s for s in states)
    full = gt.consolidate_state_dicts(states)
    assert tuple(full["0.weight"].shape) == (OUT, IN) and "0.weight_gtp_shard" not in full
    assert torch.equal(full["0.weight"].to(torch.bfloat16), saved[0][1]), "stitched shards = the gathered weight"
    loaded = run_ranks(_load_at_g2, 2, full, states[3])
    plain = _model(None)
    plain.load_state_dict(full)
    with rank_threads():  # the ranks' GEMM path: the same arithmetic, so the same bits
        y_plain = plain(torch.randn(5, IN, generator=torch.Generator().manual_seed(77))).detach()
    for g, shard, materialized, error, y in loaded:
        assert g.group_size == 2
        assert torch.equal(shard, full["0.weight"][g.row_start:g.row_start + g.valid_rows])
        assert torch.equal(materialized, full["0.weight"].to(torch.bfloat16))
        assert error is not None and "consolidate_state_dicts" in error
        assert torch.equal(y, y_plain), "a G=2 model from the G=4 checkpoint computes what GTP off does"
    with pytest.raises(ValueError, match="in no shard"):
        gt.consolidate_state_dicts(states[:2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA backend test needs a GPU")
def test_cuda_linear_matches_plain_on_one_gpu(tmp_path):
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, backend="cuda",
                    machinery_at_g1=True) as ctx:
        torch.manual_seed(5)
        sharded = gt.Linear(IN, OUT, context=ctx)
        torch.manual_seed(5)
        plain = gt.Linear(IN, OUT, device="cuda")
        ready = []
        sharded.weight.register_grad_ready_hook(ready.append)
        x = torch.randn(6, IN, device="cuda")
        assert torch.equal(sharded(x), plain(x))
        for _ in range(2):  # the second backward adds into .grad
            sharded(x).sum().backward()
            plain(x).sum().backward()
        torch.cuda.synchronize()
        assert torch.equal(sharded.weight.grad, plain.weight.grad)
        assert ready == [sharded.weight, sharded.weight], "the hook runs at each drain on CUDA"


def test_explicit_drain_accumulates_microbatches_like_autograd(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    with gt.Context(store, 0, 1, auto_drain=False, machinery_at_g1=True) as ctx:
        torch.manual_seed(8)
        sharded = gt.Linear(IN, OUT, context=ctx, bias=False)
        torch.manual_seed(8)
        plain = gt.Linear(IN, OUT, bias=False)
        for microbatch in range(2):
            x = torch.randn(3, IN, generator=torch.Generator().manual_seed(microbatch))
            sharded(x).square().sum().backward()
            plain(x).square().sum().backward()
        assert sharded.weight.grad is None, "nothing reaches .grad before drain when auto_drain=False"
        ctx.drain()
        assert torch.equal(sharded.weight.grad, plain.weight.grad)
        assert ctx.stats()["grads"]["into_main_grad"] == 2  # one rank: straight into the main grad


TP_IN, TP_HIDDEN = 64, 96  # per TP rank: 48 rows (column), 48 columns (row)


def _tp_model(context, tp_group):
    torch.manual_seed(21)
    column = gt.Linear(TP_IN, TP_HIDDEN, context=context, parallel_mode="column", tp_group=tp_group, name="column")
    row = gt.Linear(TP_HIDDEN, TP_IN, context=context, parallel_mode="row", tp_group=tp_group, name="row")
    return column, row


def _tensor_parallel(rank, world, store_dir, profile):
    store = torch.distributed.FileStore(store_path(store_dir), world)
    torch.distributed.init_process_group("gloo", store=torch.distributed.PrefixStore("pg", store), rank=rank,
                                         world_size=world)
    tp_groups = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]
    ctx = gt.Context(store, rank, world, profile_json=profile)
    tp_group = tp_groups[rank // 2]
    column, row = _tp_model(ctx, tp_group)
    x = torch.randn(5, TP_IN, generator=torch.Generator().manual_seed(ctx.sizes.data_parallel_index))
    x.requires_grad_()
    y = row(torch.nn.functional.gelu(column(x)))
    y.square().sum().backward()
    result = {"sizes": ctx.sizes, "y": y.detach(), "x_grad": x.grad, "column_geometry": column.weight.geometry,
              "row_geometry": row.weight.geometry, "column_grad": column.weight.grad, "row_grad": row.weight.grad,
              "tp_rank": column.tp_rank}
    ctx.close()
    torch.distributed.destroy_process_group()
    return result


def test_column_and_row_parallel_with_tp2_g2_match_the_unsharded_model():
    import json
    profile = json.dumps({"schema_version": 1, "cluster": {"template": {"host_count": 1, "host": {
        "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}], "gpus": [{"index": i, "numa_node": 0} for i in range(4)]}}},
        "parallel": {"world_size": 4, "tensor_model_parallel_size": 2, "tensor_parallel_num_weight_shards": 4}})
    results = run_ranks(_tensor_parallel, 4, profile)
    column, row = _tp_model(None, None)
    wgrads = {"column": [], "row": []}
    outputs = {}
    for data_index in range(2):  # the unsharded model on each data rank's microbatch
        x = torch.randn(5, TP_IN, generator=torch.Generator().manual_seed(data_index)).requires_grad_()
        y = row(torch.nn.functional.gelu(column(x)))
        y.square().sum().backward()
        outputs[data_index] = (y.detach(), x.grad)
        wgrads["column"].append(column.weight.grad)
        wgrads["row"].append(row.weight.grad)
        column.weight.grad = row.weight.grad = None
    mean = {k: (v[0] + v[1]) / 2 for k, v in wgrads.items()}
    # TP splits the GEMMs' reductions (row-parallel sums partial products over TP), so float sums
    # differ in order from the unsharded model: compared to 1e-5 relative.
    close = dict(rtol=1e-5, atol=1e-5)
    for r in results:
        s, t = r["sizes"], r["tp_rank"]
        assert (s.tp, s.gtp_remat, s.data_parallel_count) == (2, 2, 2)
        y, x_grad = outputs[s.data_parallel_index]
        torch.testing.assert_close(r["y"], y, **close)
        torch.testing.assert_close(r["x_grad"], x_grad, **close)
        g = r["column_geometry"]
        column_slice = mean["column"][t * 48:(t + 1) * 48]
        torch.testing.assert_close(r["column_grad"], column_slice[g.row_start:g.row_start + g.valid_rows], **close)
        g = r["row_geometry"]
        row_slice = mean["row"][:, t * 48:(t + 1) * 48]
        torch.testing.assert_close(r["row_grad"], row_slice[g.row_start:g.row_start + g.valid_rows], **close)


def test_gtp_loaded_before_torch_leaves_torch_importable():
    """libnccl.so.2 is one soname per process: loading libgtp first must not pin an NCCL older than
    torch's (the CUDA toolkit's), or `import torch` fails on a missing NCCL symbol."""
    import subprocess
    code = "import gtp; gtp.library_path(); import torch; print(torch.__version__)"
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), ".."))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_view_at_gives_one_tensor_per_memory_shape_dtype_and_requires_grad(tmp_path):
    """Context.view_at wraps a pointer once: the same memory, shape, dtype and requires_grad give the same
    tensor object (what makes a warm materialize cheap), which aliases the memory; any of them differing
    gives another tensor, so a tensor handed out with requires_grad never changes under its holder."""
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1) as ctx:
        memory = torch.randn(64, dtype=torch.float32)
        a = ctx.view_at(memory.data_ptr(), (8, 8), torch.float32)
        assert ctx.view_at(memory.data_ptr(), (8, 8), torch.float32) is a
        assert torch.equal(a.flatten(), memory)
        memory[5] = 7.0
        assert a[0, 5].item() == 7.0  # a view, not a copy
        trained = ctx.view_at(memory.data_ptr(), (8, 8), torch.float32, requires_grad=True)
        assert trained is not a and trained.requires_grad and not a.requires_grad
        assert ctx.view_at(memory.data_ptr(), (4, 16), torch.float32) is not a
        assert ctx.view_at(memory.data_ptr() + 32, (8, 8), torch.float32)[0, 0].item() == memory[8].item()


def test_a_parameter_whose_storage_was_replaced_is_repacked_from_its_new_values(tmp_path):
    """Megatron DDP under the distributed optimizer points `param.data` at its buffer and the optimizer
    writes there: shard_updated copies the new values into the shard libgtp registered before it
    re-packs, so the next materialize gathers them (without sync_storage it gathered the old ones)."""
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, machinery_at_g1=True) as ctx:
        layer = gt.Linear(IN, OUT, context=ctx, bias=False)
        w = layer.weight
        buffer = torch.empty(256 + w.numel(), dtype=w.dtype)[256:].view_as(w)  # a DDP-style bucket view
        buffer.copy_(w.detach())
        w.data = buffer
        with torch.no_grad():
            w.mul_(-2.0)  # the optimizer's update, in the new storage only
        ctx.shard_updated()
        full = w.materialize_group_for_forward()
        assert torch.equal(full, w.detach().to(torch.bfloat16))
        w.release_group()
        w.data = torch.empty(3, 3, dtype=w.dtype)
        with pytest.raises(ValueError, match="same shape and dtype"):
            ctx.shard_updated()


def _tag_checks_per_step(rank, world, store_dir, how):
    """Three steps of three microbatches through two gtp.torch.Linear layers at G = 2; the step's count
    of divergence checks (tag collectives of the group) after each step."""
    ctx = torch_context(rank, world, store_dir)
    torch.manual_seed(5)
    model = torch.nn.Sequential(gt.Linear(IN, 48, context=ctx), gt.Linear(48, OUT, context=ctx))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if how == "attached":
        ctx.attach_optimizer(optimizer, microbatches=3)
    checks = []
    for step in range(3):
        for microbatch in range(3):
            x = torch.randn(4, IN, generator=torch.Generator().manual_seed(100 * step + 10 * microbatch + rank))
            model(x).square().sum().backward()
        optimizer.step()
        if how == "reported":  # as gtp.megatron reports Megatron's optimizer steps
            ctx.optimizer_stepped()
            ctx.shard_updated()
        optimizer.zero_grad()
        checks.append(ctx.stats()["groups"][0]["tag_checks"])
    ctx.close()
    return checks


@pytest.mark.parametrize("how", ["attached", "reported", "control"])
def test_gradient_accumulation_costs_one_divergence_check_per_step(how):
    """With attach_optimizer(microbatches=3) gtp.torch flags the first two drains of each step midstep:
    one tag collective per step instead of one per drain. With the steps reported (optimizer_stepped,
    gtp.megatron's way) it knows from the second step on. The control, with neither, cannot tell the
    step's last drain and checks at every drain."""
    expected = {"attached": [1, 1, 1], "reported": [3, 1, 1], "control": [3, 3, 3]}[how]
    for checks in run_ranks(_tag_checks_per_step, 2, how):
        per_step = [b - a for a, b in zip([0] + checks, checks)]
        assert per_step == expected, per_step


def test_a_weight_with_several_consumers_is_summed_and_finalized_once_per_drain(tmp_path):
    """add_group_grads (a tied weight's consumers): every use adds into the one grad buffer and the drain
    finalizes it once; a finalize_group_grads of the weight before the drain takes the held adds with
    its own; a wgrad one use wrote into grad_buffer() sends the sum to main_grad whatever the later
    uses pass (TE's fused accumulation), else it goes to .grad."""
    with gt.Context(torch.distributed.FileStore(str(tmp_path / "store"), 1), 0, 1, auto_drain=False,
                    machinery_at_g1=True) as ctx:
        w = gt.Linear(IN, OUT, context=ctx, bias=False).weight
        finalized = lambda: ctx.stats()["grads"]["grads_ready"]  # noqa: E731 - one per finalized buffer
        w.add_group_grads(torch.full((OUT, IN), 2.0))
        w.add_group_grads(torch.full((OUT, IN), 3.0))
        assert finalized() == 0 and w.grad is None, "reduced before the drain"
        ctx.drain()
        assert finalized() == 1 and bool((w.grad == 5.0).all()), w.grad
        w.add_group_grads(torch.full((OUT, IN), 1.0))
        w.finalize_group_grads(torch.full((OUT, IN), 4.0))
        ctx.drain()
        assert finalized() == 2 and bool((w.grad == 10.0).all()), "the held add was lost or reduced twice"
        w.grad = None
        w.grad_buffer().fill_(6.0)  # as TE writes its wgrad
        w.add_group_grads()
        w.add_group_grads(torch.full((OUT, IN), 1.0))
        ctx.drain()
        assert finalized() == 3 and w.grad is None and bool((w.main_grad == 7.0).all()), w.main_grad

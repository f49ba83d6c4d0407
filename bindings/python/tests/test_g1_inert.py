"""A group of one is inert by default (gtp.torch.Context's machinery_at_g1=False), as Megatron-Core's
GTP is at size 1: gtp.torch.Linear and GroupedLinear keep plain parameters, compute exactly what the
GTP-off layer computes (every wire), and no call reaches libgtp while they build, train and step
(counted by a CountingLibraryDouble between the context and libgtp); checkpoints load and save across
the inert and the machinery forms. The machinery at G = 1 is still there on request, and the same
double sees its calls. Host backend, CPU."""
import pytest

torch = pytest.importorskip("torch")
import gtp.torch as gt  # noqa: E402
from counting_library import count_library_calls  # noqa: E402

EXPERTS, IN, MID, OUT = 3, 64, 48, 40  # OUT not a multiple of 16: the machinery pads its rows
M_SPLITS = [4, 0, 3]


def _context(tmp_path, name, **kwargs):
    return gt.Context(torch.distributed.FileStore(str(tmp_path / name), 1), 0, 1, **kwargs)


def _build(context, wire, seed=4):
    torch.manual_seed(seed)
    linear = gt.Linear(IN, MID, context=context, wire=wire)
    grouped = gt.GroupedLinear(EXPERTS, MID, OUT, context=context, wire=wire)
    return linear, grouped


def _train(linear, grouped, context, steps=2, microbatches=2):
    """SGD steps of `microbatches` backward passes each (the context, if any, attached to the optimizer
    and asked for everything a training loop calls on it); returns every output, input grad, weight
    grad and parameter along the way."""
    params = list(linear.parameters()) + list(grouped.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    if context is not None:
        context.attach_optimizer(optimizer, microbatches=microbatches)
    seen = []
    for step in range(steps):
        for microbatch in range(microbatches):
            x = torch.randn(sum(M_SPLITS), IN, generator=torch.Generator().manual_seed(10 * step + microbatch))
            x.requires_grad_()
            y = grouped(torch.nn.functional.gelu(linear(x)), M_SPLITS)
            y.square().sum().backward()
            seen += [y.detach(), x.grad]
            if context is not None:
                context.drain()  # what a loop with auto_drain=False calls (a second drain: a no-op)
        seen += [p.grad.clone() for p in params]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if context is not None:
            context.main_grads_zeroed()
        seen += [p.detach().clone() for p in params]
    return seen


@pytest.mark.parametrize("wire", ["bf16", "fp8", "nvfp4"])
def test_layers_in_a_group_of_one_are_gtp_off_and_never_call_libgtp(tmp_path, wire):
    with _context(tmp_path, "inert") as ctx:
        calls = count_library_calls(ctx)
        assert not ctx.uses_libgtp("gtp_remat") and not ctx.uses_libgtp("expert_gtp_remat")
        linear, grouped = _build(ctx, wire)
        assert type(linear.weight) is torch.nn.Parameter and not linear.sharded
        assert all(type(w) is torch.nn.Parameter for w in grouped.weights()) and not grouped.sharded
        assert "inert" in repr(linear) and "inert" in repr(grouped)
        inert = _train(linear, grouped, ctx)
        assert calls.total() == 0, f"calls reached libgtp at G = 1: {dict(calls.calls)}"
        assert not ctx.parameters and ctx.stats()["materialize"]["calls"] == 0
    plain_linear, plain_grouped = _build(None, wire)
    plain = _train(plain_linear, plain_grouped, None)
    assert len(inert) == len(plain)
    for i, (got, want) in enumerate(zip(inert, plain)):
        assert got.dtype == want.dtype and torch.equal(got, want), f"item {i} differs from GTP off"


def test_machinery_at_g1_runs_libgtp_and_still_matches_gtp_off_on_the_bf16_wire(tmp_path):
    """The explicit option: every weight on libgtp at G = 1, its calls seen by the same double (so the
    inert test's zero is no blind spot), and the BF16 wire's results still GTP off's bit for bit."""
    with _context(tmp_path, "machinery", machinery_at_g1=True) as ctx:
        calls = count_library_calls(ctx)
        assert ctx.uses_libgtp("gtp_remat") and ctx.uses_libgtp("expert_gtp_remat")
        linear, grouped = _build(ctx, "bf16")
        assert linear.sharded and grouped.sharded and len(ctx.parameters) == 1 + EXPERTS
        machinery = _train(linear, grouped, ctx)
        for name in ("gtp_weight_register", "gtp_materialize", "gtp_release", "gtp_grad_buffer_ex", "gtp_finalize",
                     "gtp_drain_ex", "gtp_weights_shard_updated"):
            assert calls.calls[name] > 0, (name, dict(calls.calls))
    plain = _train(*_build(None, "bf16"), None)
    for i, (got, want) in enumerate(zip(machinery, plain)):
        assert torch.equal(got, want), f"item {i} differs from GTP off"


def test_an_unknown_group_or_wire_is_refused_at_g1_too(tmp_path):
    with _context(tmp_path, "names") as ctx:
        with pytest.raises(ValueError, match="group='experts' is unknown; use one of"):
            ctx.uses_libgtp("experts")
        with pytest.raises(ValueError, match="group='experts' is unknown"):
            gt.GroupedLinear(EXPERTS, MID, OUT, context=ctx, group="experts")
        for build in (lambda: gt.Linear(IN, MID, context=ctx, wire="fp6"),
                      lambda: gt.GroupedLinear(EXPERTS, MID, OUT, context=ctx, wire="fp6")):
            with pytest.raises(ValueError, match="wire='fp6' is unknown"):
                build()


def test_checkpoints_pass_between_the_inert_and_the_machinery_forms(tmp_path):
    """An inert layer saves what GTP off saves (no shard offsets); that loads into the machinery form at
    G = 1, whose state dict (one whole shard, with its offsets) loads back into an inert layer; a part
    of a weight (another G's shard) is refused, naming consolidate_state_dicts."""
    with _context(tmp_path, "inert") as inert_ctx, _context(tmp_path, "on", machinery_at_g1=True) as on_ctx:
        inert, _ = _build(inert_ctx, "bf16", seed=1)
        plain, _ = _build(None, "bf16", seed=1)
        saved = inert.state_dict()
        assert sorted(saved) == sorted(plain.state_dict()) == ["bias", "weight"]
        assert all(torch.equal(saved[k], plain.state_dict()[k]) for k in saved)
        assert gt.consolidate_state_dicts([saved]).keys() == saved.keys()
        machinery, _ = _build(on_ctx, "bf16", seed=2)  # other values until loaded
        machinery.load_state_dict(saved)
        assert torch.equal(machinery.weight.detach(), saved["weight"])
        full = machinery.weight.materialize_group_for_forward()
        assert torch.equal(full, saved["weight"].to(torch.bfloat16)), "re-packed after the load"
        machinery.weight.release_group()
        with torch.no_grad():
            machinery.weight.mul_(-1.0)
        on_ctx.shard_updated([machinery.weight])
        on_saved = machinery.state_dict()
        assert "weight_gtp_shard" in on_saved
        fresh, _ = _build(inert_ctx, "bf16", seed=3)
        fresh.load_state_dict(on_saved)
        assert torch.equal(fresh.weight.detach(), on_saved["weight"])
        x = torch.randn(5, IN, generator=torch.Generator().manual_seed(0))
        assert torch.equal(fresh(x), machinery(x))
        part = {"weight": on_saved["weight"][:16].clone(), "bias": on_saved["bias"],
                "weight_gtp_shard": torch.tensor([0, 16, MID, IN], dtype=torch.int64)}
        with pytest.raises(RuntimeError, match="consolidate_state_dicts"):
            fresh.load_state_dict(part)
        on_ctx.drain()

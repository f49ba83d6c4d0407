"""TransformerEngine's layers on libgtp at G = 2 and 4 with real NCCL peers sharing one GPU
(gtp.shared_gpu; docs/real-peers.md): each rank trains te.Linear, te.LayerNormLinear and te.GroupedLinear
on libgtp next to the same TE layer without GTP, on its own data. Per step: the output and the input
grad equal the plain layer's bit for bit (the gathered weight is the whole weight; on the FP8 wire TE's
own current-scaling codes, the amax reduced over the group); each weight grad equals the mean over the
ranks of the plain layers' FP32 wgrads (TE's fused accumulation on both sides), this rank's rows (bit
for bit at G = 2, where a sum of two rounds one way; within 1e-6 relative at G = 4, where NCCL's
summation order may round differently);
after an optimizer step on libgtp's reduced grads (the plain layer's made of every rank's rows of them)
the shard equals the plain layer's rows. Skips without a GPU or without TE."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ranks import run_ranks  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: real NCCL peers need a GPU to share", allow_module_level=True)
pytest.importorskip("transformer_engine.pytorch", reason="TransformerEngine is not installed "
                    "(pip install transformer_engine[pytorch]; the GPU machine's copy: ../shared/te-h200)")

HIDDEN, FFN, TOKENS, EXPERTS, STEPS = 256, 512, 64, 4, 4
KINDS = ("linear_column", "layernorm_linear", "grouped_linear")
MODES = {"bf16": ("bf16", False), "fp8cs_fp8_wire": ("fp8", True)}


def _layer(kind, fuse=False):
    import transformer_engine.pytorch as te
    kw = dict(params_dtype=torch.bfloat16, fuse_wgrad_accumulation=fuse)
    if kind == "linear_column":
        return te.Linear(HIDDEN, FFN, **kw)
    if kind == "layernorm_linear":
        return te.LayerNormLinear(HIDDEN, FFN, **kw)
    return te.GroupedLinear(EXPERTS, HIDDEN, FFN, **kw)


def _weights(layer):
    names = [f"weight{i}" for i in range(EXPERTS)] if hasattr(layer, "weight0") else ["weight"]
    return [getattr(layer, n) for n in names]


def _forward(layer, x, fp8):
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe
    with te.autocast(enabled=fp8, recipe=recipe.Float8CurrentScaling() if fp8 else None):
        return layer(x, [TOKENS // EXPERTS] * EXPERTS) if hasattr(layer, "weight0") else layer(x)


def _rank(rank, world, store_dir):
    import gtp.torch as gt
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", store=torch.distributed.FileStore(os.path.join(store_dir, "pg"), world),
                                         rank=rank, world_size=world)
    seen = []
    for kind in KINDS:
        for mode, (wire, fp8) in MODES.items():
            store = torch.distributed.FileStore(os.path.join(store_dir, f"ctx_{kind}_{mode}"), world)
            # Both accumulate their wgrads in FP32 through TE's fused path (the plain layer into its
            # main_grad, libgtp's into its grad buffer), so both means are of the same FP32 values.
            torch.manual_seed(0)
            ref = _layer(kind, fuse=True)
            for w_ref in _weights(ref):
                w_ref.main_grad = torch.zeros_like(w_ref, dtype=torch.float32)
            torch.manual_seed(0)
            layer = _layer(kind, fuse=True)
            with gt.Context(store, rank, world, backend="cuda", prefetch_depth=1, timeout_s=300) as ctx:
                sharded = gt.te.distribute(layer, ctx, wire=wire)
                assert len(sharded) == len(_weights(layer))
                opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
                ctx.attach_optimizer(opt)
                worst = 0.0
                for step in range(STEPS):
                    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16,
                                    generator=torch.Generator("cuda").manual_seed(1000 * step + rank))
                    x_ref, x_gtp = x.clone().requires_grad_(), x.clone().requires_grad_()
                    y_ref = _forward(ref, x_ref, fp8)
                    y_ref.float().square().mean().backward()
                    y = _forward(layer, x_gtp, fp8)
                    y.float().square().mean().backward()
                    where = f"{kind} {mode} G={world} rank {rank} step {step}"
                    assert torch.equal(y, y_ref), f"{where}: forward"
                    assert torch.equal(x_gtp.grad, x_ref.grad), f"{where}: dgrad"
                    for w_ref, w in zip(_weights(ref), _weights(layer)):
                        mean = w_ref.main_grad / world  # libgtp pre-scales by 1/G, then sums in FP32
                        torch.distributed.all_reduce(mean)
                        g = w.geometry
                        expected, got = mean[g.row_start:g.row_start + g.valid_rows], w.main_grad
                        assert got.shape == expected.shape, where
                        diff = (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-30) \
                            if got.numel() else 0.0
                        worst = max(worst, diff)
                        if world == 2:
                            assert torch.equal(got, expected), f"{where}: weight grad differs by {diff:.3g} (relative)"
                        else:
                            assert diff <= 1e-6, f"{where}: weight grad differs by {diff:.3g} (relative)"
                        # Both step with libgtp's reduced grad, the plain layer with every rank's rows of
                        # it, so that their parameters stay equal at any G (the check above bounds it).
                        padded = torch.zeros(g.shard_rows, got.shape[1], dtype=got.dtype, device=got.device)
                        padded[:g.valid_rows] = got
                        every = torch.empty(world * g.shard_rows, got.shape[1], dtype=got.dtype, device=got.device)
                        torch.distributed.all_gather_into_tensor(every, padded)
                        w_ref.grad = every[:mean.shape[0]].to(w_ref.dtype)
                        w.grad = got.to(w.dtype)
                        w_ref.main_grad.zero_()
                        w.main_grad.zero_()
                    ctx.main_grads_zeroed(_weights(layer))
                    for p_ref, p in zip(ref.parameters(), layer.parameters()):
                        if not hasattr(p, "geometry"):  # replicated (LayerNorm, bias): the mean over ranks too
                            for q in (p_ref, p):
                                torch.distributed.all_reduce(q.grad)
                                q.grad /= world
                    opt_ref.step()
                    opt.step()
                    opt_ref.zero_grad()
                    opt.zero_grad()
                    for w_ref, w in zip(_weights(ref), _weights(layer)):
                        g = w.geometry
                        rows = w_ref.detach()[g.row_start:g.row_start + g.valid_rows]
                        assert torch.equal(w.detach(), rows), f"{where}: shard after the step"
            seen.append((kind, mode, worst))
    torch.distributed.destroy_process_group()
    return seen


@pytest.mark.parametrize("world", [2, 4])
def test_te_layers_on_real_nccl_peers_match_the_plain_layers(world):
    seen = run_ranks(_rank, world, timeout_s=900, share_gpu=True)
    assert all(len(s) == len(KINDS) * len(MODES) for s in seen)
    print(f"G = {world}: worst relative weight-grad difference per (layer, mode):", seen[0])

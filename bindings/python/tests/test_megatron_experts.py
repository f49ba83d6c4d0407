"""Expert GTP (EG = 2) on libgtp with Megatron-Core 0.19.2's own non-TE MoE layer on the host backend
(gloo, 4 processes): MoELayer from get_moe_module_spec(use_te=False) (TopKRouter, the allgather token
dispatcher, SequentialMLP of ColumnParallelLinear / RowParallelLinear with is_expert=True). Those
layers call wrap_module_params_gtp with the expt_gtp_remat group (tensor_parallel/layers.py), so at
EG = 2 every expert weight is a libgtp shard of libgtp's expert group. Compared with the same layers
at EG = 1 without libgtp, and torch_dist checkpoints of the MoE layer across EG and EP. Skips, saying
why, without megatron-core."""
import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed (tools/setup.sh installs megatron-core 0.19.2)", allow_module_level=True)

import gtp.megatron as gm  # noqa: E402
from megatron_cpu_doubles import init_megatron, without_cuda_streams  # noqa: E402
from ranks import run_ranks  # noqa: E402

HIDDEN, FFN, EXPERTS, WORLD = 32, 64, 4, 4
EXPERT_WEIGHTS = ("linear_fc1.weight", "linear_fc2.weight")


def _init(rank, world, store_dir, ep, eg, gtp=1):
    return init_megatron(rank, world, store_dir, gtp_remat_size=gtp, expert_model_parallel_size=ep,
                         expert_gtp_remat_size=eg)


def _moe(ep, ffn=FFN, seed=7, shards=None):
    """Megatron-Core's MoE layer with its local (non-TE) experts, BF16 weights initialized on the CPU;
    shards: the config's weight-shard knobs (dense and expert), as Megatron-LM sets them."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=ffn,
                               moe_ffn_hidden_size=ffn, num_moe_experts=EXPERTS, moe_router_topk=2,
                               moe_token_dispatcher_type="allgather", expert_model_parallel_size=ep,
                               moe_aux_loss_coeff=0.0, use_cpu_initialization=True, params_dtype=torch.bfloat16,
                               bf16=True, add_bias_linear=True, tensor_parallel_num_weight_shards=shards,
                               expert_tensor_parallel_num_weight_shards=shards)
    torch.manual_seed(seed)
    return get_moe_module_spec(use_te=False, num_experts=EXPERTS, moe_grouped_gemm=False)(config=config)


def _step(moe, rank, seed):
    """One forward and backward on this rank's tokens: the output and the input's gradient."""
    x = torch.randn(6, 2, HIDDEN, generator=torch.Generator().manual_seed(100 * seed + rank)).bfloat16()
    x.requires_grad_()
    out, _ = moe(x)
    out.float().square().sum().backward()
    return out.detach(), x.grad


def _experts(moe):
    """{(global expert, weight name): parameter} of this rank's local experts."""
    from megatron.core import parallel_state as ps
    local = moe.experts.local_experts
    first = ps.get_expert_model_parallel_rank() * len(local)
    return {(first + i, name): expert.get_parameter(name) for i, expert in enumerate(local) for name in EXPERT_WEIGHTS}


def _rows(p):
    return p.geometry.row_start if isinstance(p, gm.MegatronParameter) else 0


def _train(rank, world, store_dir, eg, libgtp):
    ps = _init(rank, world, store_dir, ep=2, eg=eg)
    ctx = gm.use_libgtp(backend="host") if libgtp else None  # check=True: libgtp's groups against Megatron's
    moe = _moe(ep=2)
    out, dx = _step(moe, rank, 1)
    result = {"out": out, "dx": dx, "router_grad": moe.router.weight.grad,
              "experts": {k: ((type(p).__name__, p.allreduce), _rows(p), p.detach().clone(), p.grad)
                          for k, p in _experts(moe).items()},
              "biases": [p.grad for n, p in moe.named_parameters() if n.endswith("bias")]}  # the router's, 2 per expert
    if libgtp:
        stats = ctx.stats()
        result["groups"] = [(g["name"], g["materializations"]) for g in stats["groups"]]
        result["reduce_scatters"] = stats["grads"]["reduce_scatters"]
        result["eg_ranks"] = torch.distributed.get_process_group_ranks(ps.get_expert_gtp_weight_remat_group())
        result["libgtp_eg"] = (ctx.sizes.expert_gtp_remat, ctx.sizes.expert_gtp_remat_rank,
                               ctx.group_rank("expert_gtp_remat"))
        result["megatron_eg_rank"] = ps.get_expert_gtp_weight_remat_rank()
        gm.reset()
    return result


def test_megatron_experts_at_eg2_on_libgtp_match_the_layers_at_eg1_without_it():
    """EP 2 x EG 2 at world 4: every expert weight of Megatron's SequentialMLP is a libgtp shard in its
    expert group (libgtp's groups[1], expt_gtp_remat; the dense group untouched), whose members are
    Megatron's expert GTP group; outputs, input gradients, router and bias gradients are bit-identical to
    the same layers at EG = 1 without libgtp, and each expert shard's gradient is the mean over the EG
    peers' unsharded gradients (libgtp's reduce-scatter mean; DDP completes it as with Megatron's GTP)."""
    on = run_ranks(_train, WORLD, 2, True)
    off = run_ranks(_train, WORLD, 1, False)
    for rank, (r, o) in enumerate(zip(on, off)):
        peers = [rank % 2, rank % 2 + 2]  # Megatron's expert grid tp-cp-ep-gtp_remat-dp-pp: EP fastest, then EG
        assert r["eg_ranks"] == peers, r["eg_ranks"]
        assert r["libgtp_eg"] == (2, rank // 2, rank // 2) and r["megatron_eg_rank"] == rank // 2
        # 2 local experts x 2 weights, each gathered for forward and for backward; one reduce-scatter each
        assert r["groups"] == [("gtp_remat", 0), ("expt_gtp_remat", 8)], r["groups"]
        assert r["reduce_scatters"] == 4
        assert torch.equal(r["out"], o["out"]) and torch.equal(r["dx"], o["dx"])
        assert torch.equal(r["router_grad"], o["router_grad"])
        assert len(r["biases"]) == 5 and all(torch.equal(a, b) for a, b in zip(r["biases"], o["biases"]))
        assert len(r["experts"]) == 4
        for key, (kind, start, shard, grad) in r["experts"].items():
            # allreduce=False (Megatron's expert tag, kept on the shard): DDP reduces it over expert DP
            assert kind == ("MegatronParameter", False) and o["experts"][key][0] == ("Parameter", False)
            full, rows = o["experts"][key][2], shard.shape[0]
            assert rows * 2 == full.shape[0] and start == rank // 2 * rows
            assert torch.equal(shard, full[start:start + rows])
            a, b = (off[p]["experts"][key][3].float() for p in peers)
            mean = ((a + b) / 2).bfloat16()
            assert grad.dtype == torch.bfloat16 and torch.equal(grad, mean[start:start + rows]), key


def _sharded(moe):
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
    return moe.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group(None))


def _ckpt_save(rank, world, store_dir, folder, eg, libgtp):
    """Saves the MoE layer (biases made non-zero) and runs the next step; at EG = 2 also tries a split
    libgtp pads (48 expert rows over EG = 2)."""
    _init(rank, world, store_dir, ep=2, eg=eg)
    if libgtp:
        gm.use_libgtp(backend="host")
    from megatron.core import dist_checkpointing
    moe = _moe(ep=2, seed=11)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    dist_checkpointing.save(_sharded(moe), folder)
    saved = {k: (_rows(p), p.detach().clone()) for k, p in _experts(moe).items()}
    result = {"saved": saved, "next": _step(moe, rank, 2), "refusal": None}
    if libgtp:
        try:
            _sharded(_moe(ep=2, ffn=48, seed=12))
        except ValueError as error:
            result["refusal"] = str(error)
        gm.reset()
    return result


def _ckpt_load(rank, world, store_dir, folder, ep, eg, libgtp):
    _init(rank, world, store_dir, ep=ep, eg=eg)
    if libgtp:
        gm.use_libgtp(backend="host")
    from megatron.core import dist_checkpointing
    moe = _moe(ep=ep, seed=99)  # other values until loaded
    moe.load_state_dict(dist_checkpointing.load(_sharded(moe), folder))
    loaded = {k: (type(p).__name__, _rows(p), p.detach().clone()) for k, p in _experts(moe).items()}
    result = {"loaded": loaded}
    # At the saving layout the next step is compared (libgtp gathers what it re-packed after the load).
    # Not at EP 1: Megatron-Core's expert MLP then adds its bias in place into the view its row-parallel
    # layer returns, which autograd refuses (with or without GTP).
    if ep == 2:
        result["next"] = _step(moe, rank, 2)
    if libgtp:
        gm.reset()
    return result


def _global_experts(saved):
    """Each expert weight as one tensor, from the shards the ranks saved (each EG peer its rows)."""
    blocks = {}
    for result in saved:
        for key, (start, value) in result["saved"].items():
            blocks.setdefault(key, {})[start] = value
    return {key: torch.cat([rows[s] for s in sorted(rows)]) for key, rows in blocks.items()}


def _check_loaded(loaded, weights, kind, rows_per_rank):
    for r in loaded:
        for key, (got_kind, start, value) in r["loaded"].items():
            assert got_kind == kind, (key, got_kind)
            assert value.shape[0] == weights[key].shape[0] // rows_per_rank
            assert torch.equal(value, weights[key][start:start + value.shape[0]]), key


def test_moe_torch_dist_checkpoint_across_eg_and_ep(tmp_path):
    """Megatron's sharded_state_dict of the MoE layer with libgtp expert shards at EP 2 x EG 2 (real
    torch_dist files): loads at EG = 1 without libgtp and on libgtp at EG = 2 (a fresh context), each
    continuing bit-identically (the next step's outputs and input gradients equal the saving run's),
    and at EP 1 x EG 2 and EP 4 x EG 1 (experts on other ranks) with each weight's rows equal to the
    saved global weight. The reverse: saved at EG = 1 without libgtp, loaded
    on libgtp at EG = 2, continuing identically. A split libgtp pads is refused at save."""
    eg2, off = tmp_path / "eg2", tmp_path / "off"
    eg2.mkdir()
    off.mkdir()
    saved = run_ranks(_ckpt_save, WORLD, str(eg2), 2, True)
    for r in saved:
        assert r["refusal"] is not None and "48 rows over G=2 are padded to 64" in r["refusal"], r["refusal"]
    weights = _global_experts(saved)
    assert len(weights) == 2 * EXPERTS and all(w.shape[0] in (FFN, HIDDEN) for w in weights.values())
    for ep, eg, libgtp, kind in ((2, 1, False, "Parameter"), (2, 2, True, "MegatronParameter"),
                                 (1, 2, True, "MegatronParameter"), (4, 1, False, "Parameter")):
        loaded = run_ranks(_ckpt_load, WORLD, str(eg2), ep, eg, libgtp)
        assert sum(len(r["loaded"]) for r in loaded) == 2 * EXPERTS * WORLD // ep
        _check_loaded(loaded, weights, kind, eg)
        if ep == 2:  # the saving layout's experts: the same tokens meet the same experts
            for r, s in zip(loaded, saved):
                assert torch.equal(r["next"][0], s["next"][0]) and torch.equal(r["next"][1], s["next"][1])
    # The reverse: written without libgtp at EG = 1, read into libgtp's shards at EG = 2.
    written = run_ranks(_ckpt_save, WORLD, str(off), 1, False)
    loaded = run_ranks(_ckpt_load, WORLD, str(off), 2, 2, True)
    _check_loaded(loaded, _global_experts(written), "MegatronParameter", 2)
    for r, s in zip(loaded, written):
        assert torch.equal(r["next"][0], s["next"][0]) and torch.equal(r["next"][1], s["next"][1])


def _ddp(rank, world, store_dir, g):
    """One backward of the MoE layer through Megatron-Core's DistributedDataParallel (FP32 main grads)
    and finalize_model_grads at G = EG = g (world 4, EP 2): the main grads they leave."""
    _init(rank, world, store_dir, ep=2, eg=g, gtp=g)
    without_cuda_streams()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.transformer.module import MegatronModule
    ctx = gm.use_libgtp(backend="host") if g > 1 else None
    moe = _moe(ep=2, shards=g)
    assert (moe.config.gtp_weight_remat_size, moe.config.expert_gtp_weight_remat_size) == (g, g)

    class Model(MegatronModule):
        def __init__(self):
            super().__init__(moe.config)
            self.moe = moe

        def forward(self, x):
            return self.moe(x)[0].float().square().mean()
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True)
    model = DistributedDataParallel(moe.config, ddp_config, Model())
    gm.check_training(moe.config, ddp_config)
    model.zero_grad_buffer()
    model(torch.randn(6, 2, HIDDEN, generator=torch.Generator().manual_seed(rank)).bfloat16()).backward()
    finalize_model_grads([model])
    grads = {n: (_rows(p) if isinstance(p, gm.MegatronParameter) else None, p.main_grad.clone())
             for n, p in model.named_parameters()}
    if ctx is not None:
        gm.reset()
    return grads


def test_moe_through_megatron_ddp_and_finalize_at_g_eq_eg_2_matches_dp4():
    """G = EG = 2 (world 4: dense DP 2, EP 2, expert DP 1) on libgtp against GTP off (DP 4, expert DP
    2) through Megatron-Core's DDP and finalize_model_grads: the router's and the experts' biases
    (Megatron's own reduction: DDP, then its all-reduce over the expert GTP group) are bit-identical;
    each expert shard's main grad is the DP-4 one with libgtp's mean over EG rounded once to the
    weight's BF16 (gtp.torch delivers a wgrad Megatron's linear returned into .grad, which DDP adds)."""
    on = run_ranks(_ddp, WORLD, 2)
    off = run_ranks(_ddp, WORLD, 1)
    for r, o in zip(on, off):
        assert len(r) == len(o) == 1 + 1 + 2 * 2 * 2
        for name, (start, grad) in r.items():
            full = o[name][1]
            if start is None:
                assert torch.equal(grad, full), name
            else:
                expected = full[start:start + grad.shape[0]]
                # off: (g0 + g2) / 4 in FP32; on: bf16((g0 + g2) / 2) / 2 (DDP's 1 / DP over DP 2)
                assert torch.equal(grad, (expected * 2).bfloat16().float() / 2), name

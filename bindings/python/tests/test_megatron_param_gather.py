"""overlap_param_gather=True on libgtp (gtp/megatron/param_gather.py), with the real Megatron-Core 0.19.2
DistributedDataParallel, bucket groups and DistributedOptimizer on gloo and the host backend: world 4 =
G 2 x DP 2, so each bucket's all-gather carries the other DP rank's half of every weight. Skips, saying
why, without megatron-core."""
import importlib.util

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed (tools/setup.sh installs megatron-core 0.19.2)",
                allow_module_level=True)

import gtp.megatron as gm  # noqa: E402
from ranks import run_ranks  # noqa: E402
from megatron_cpu_doubles import CudaTensorsOnCpu, without_cuda_streams  # noqa: E402
from test_megatron import _init  # noqa: E402

VOCAB, HIDDEN, FFN = 96, 32, 64
STEPS, MICROBATCHES = 4, 2


def _model(config):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
    from megatron.core.transformer.module import MegatronModule

    class Model(MegatronModule):
        """Megatron-Core's embedding and two column-parallel linears: all three on libgtp at G = 2."""

        def __init__(self):
            super().__init__(config)
            torch.manual_seed(7)
            init = torch.nn.init.normal_
            self.embedding = VocabParallelEmbedding(VOCAB, HIDDEN, init_method=init, config=config)
            self.up = ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init, bias=False,
                                           gather_output=False)
            self.down = ColumnParallelLinear(FFN, HIDDEN, config=config, init_method=init, bias=False,
                                             gather_output=False)

        def forward(self, tokens):
            hidden, _ = self.up(self.embedding(tokens))
            out, _ = self.down(torch.nn.functional.gelu(hidden))
            return out.float().square().mean()
    return Model()


def _train(rank, world, store_dir, gtp, overlap, repack="deferred", prefetch_depth=None, bucket_size=1):
    """STEPS optimizer steps of MICROBATCHES microbatches through Megatron-Core's DDP (bucket_size 1:
    one bucket group per weight), DistributedOptimizer (Adam) and finalize_model_grads; each rank its
    own data. Returns the losses, libgtp's stale_prefetches after each step, the parameters after a
    synchronous all-gather (disable_forward_pre_hook, as before an evaluation or a checkpoint) and the
    loss of one more microbatch. repack="at_step" is the control: every weight re-packed at the step,
    as before param_gather.py."""
    _init(rank, world, store_dir, gtp=gtp)
    without_cuda_streams()
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    ctx = gm.use_libgtp(backend="host", prefetch_depth=prefetch_depth) if gtp > 1 else None
    if repack == "at_step":
        gm.active().param_gather.after_step = lambda leaders: list(leaders)
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=1, use_cpu_initialization=True,
                               params_dtype=torch.bfloat16, bf16=True, tensor_parallel_num_weight_shards=gtp)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True,
                                               overlap_param_gather=overlap, grad_reduce_in_fp32=True,
                                               bucket_size=bucket_size)
    model = DistributedDataParallel(config, ddp_config, _model(config))
    gm.check_training(config, ddp_config)
    with CudaTensorsOnCpu():
        optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, clip_grad=0.0,
                                                           use_distributed_optimizer=True),
                                           [model], use_gloo_process_groups=False)
    data = torch.Generator().manual_seed(100 + rank)
    batch = lambda: torch.randint(0, VOCAB, (5, 3), generator=data)  # noqa: E731
    result = {"groups": len(model.bucket_groups), "losses": [], "stale": []}
    for _ in range(STEPS):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        for _ in range(MICROBATCHES):
            loss = model(batch())
            loss.backward()
            result["losses"].append(loss.item())
        finalize_model_grads([model])
        with CudaTensorsOnCpu():
            ok, _, _ = optimizer.step()
        assert ok
        if ctx is not None:
            result["stale"].append(ctx.stats()["materialize"]["stale_prefetches"])
    if overlap:  # every bucket group gathered at once, as Megatron-LM does before evaluating or saving
        model.disable_forward_pre_hook()
    if ctx is not None:
        result["stale_sync"] = ctx.stats()["materialize"]["stale_prefetches"] - result["stale"][-1]
    result["params"] = {name: p.detach().clone() for name, p in model.module.named_parameters()}
    model.zero_grad_buffer()
    loss = model(batch())
    loss.backward()
    result["last_loss"] = loss.item()
    if ctx is not None:
        gm.reset()
    return result


def _runs(*args):
    return run_ranks(_train, 4, *args)


def _per_step(counts):
    return [b - a for a, b in zip([0] + counts, counts)]


@pytest.fixture(scope="module")
def synchronous():
    """The reference: the same training with overlap_param_gather=False (all-gather inside the step)."""
    return _runs(2, False)


def test_overlap_param_gather_matches_the_synchronous_gather_bit_for_bit(synchronous):
    """G 2 x DP 2, four steps of two microbatches: with overlap_param_gather the losses, the parameters
    and one more microbatch equal the run without it bit for bit, at prefetch depth 1 and 2, and with
    two weights in one bucket group (each weight is re-packed once its bucket group has gathered). The
    cost, per step from the third on: the weights prefetched from a bucket group before its all-gather
    ended are gathered again, 2 at depth 1 and 3 at depth 2 with 3 bucket groups (2 boundaries), 1 at
    depth 1 with 2 groups (`down` and `up` in one); the second step has one more, the head prefetched at
    the first step's last drain (before the context knows how many drains a step has), which the run
    without overlap re-gathers at the first step. Gathering every group at once
    (disable_forward_pre_hook) re-packs once, after the last group: no re-gather. Both stay within
    rounding of GTP off at DP 4 (gradients summed in another order)."""
    overlapped, deeper = _runs(2, True), _runs(2, True, "deferred", 2)
    shared = _runs(2, True, "deferred", None, 2048)  # buckets close at 2048 elements: down + up, embedding
    off = _runs(1, False)  # GTP off, DP 4: the same data per rank
    for rank in range(4):
        s, o, d, two = synchronous[rank], overlapped[rank], deeper[rank], shared[rank]
        assert (s["groups"], o["groups"], two["groups"]) == (3, 3, 2)
        for run in (o, d, two):
            assert run["losses"] == s["losses"], (rank, run["losses"], s["losses"])
            assert run["last_loss"] == s["last_loss"]
            for name, value in run["params"].items():
                assert torch.equal(value, s["params"][name]), (rank, name)
            assert run["stale_sync"] == 0, run["stale_sync"]
        assert _per_step(s["stale"]) == [1, 0, 0, 0], s["stale"]
        assert _per_step(o["stale"]) == [0, 3, 2, 2], o["stale"]
        assert _per_step(d["stale"]) == [0, 4, 3, 3], d["stale"]
        assert _per_step(two["stale"]) == [0, 2, 1, 1], two["stale"]
        torch.testing.assert_close(torch.tensor(o["losses"]), torch.tensor(off[rank]["losses"]), rtol=1e-3,
                                   atol=0)


def test_repacking_at_the_step_reads_half_gathered_weights(synchronous):
    """The control: re-packing every weight at the optimizer step (what gtp.megatron did before, and
    why it refused overlap_param_gather) gives other losses from the second step on."""
    for t, r in zip(_runs(2, True, "at_step"), synchronous):
        assert t["losses"][:MICROBATCHES] == r["losses"][:MICROBATCHES]  # before any update
        assert t["losses"][MICROBATCHES:MICROBATCHES + 1] != r["losses"][MICROBATCHES:MICROBATCHES + 1], t["losses"]

"""Megatron-Core 0.19.2 training on libgtp (gtp.megatron) against the same run without GTP, one GPU.

One part per process (tools/gpu/run.sh megatron runs each with its own time limit, so one
failure hides nothing else):
  gpt        GPTModel, TE layer spec, 4 layers: GTP off, libgtp at G = 1 with its machinery on
             (use_libgtp(machinery_at_g1=True); the default there is inert), GTP off again (control);
             FP32 main grads, BF16 main grads (DDP grad_reduce_in_fp32=False), and TE's fused wgrad
             into main_grad; asserts BF16 losses and grad norms bit-identical
  moe        the same with 4 experts in TEGroupedLinear (moe_grouped_gemm), top-2, alltoall dispatcher
  fp8        GPT under TE FP8 current scaling (tensorwise): libgtp's BF16 wire and FP8 wire; bound below
  recompute  GPT with full activation recompute (uniform, 1 layer per chunk), FP32 main grads
  ckpt       libgtp: 8 steps, torch_dist save (model + distributed optimizer), 8 more; a fresh libgtp
             model loads it and runs the 8 again (identical losses asserted); a GTP-off model loads
             the same checkpoint and runs them too
Every run goes through Megatron's DDP (overlapped grad reduction, buckets), distributed optimizer
(Adam, grad clipping 1.0) and finalize_model_grads via the pipeline schedule (2 microbatches).
Writes one JSON per part: losses (and their float.hex), grad norms, step time, peak memory."""
import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from functools import partial

os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "0"  # deterministic TE attention (deterministic_mode needs it)
import torch  # noqa: E402

FP8_BOUND = 1e-2  # |loss_gtp - loss_off| / loss_off, every step, under FP8 current scaling
SEQ, MICRO, MICROBATCHES, VOCAB = 512, 2, 2, 8192


def init():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(1, 1)


def transformer_config(moe=False, fp8=False, recompute=False):
    from megatron.core.transformer.transformer_config import TransformerConfig
    kwargs = dict(num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
                  pipeline_dtype=torch.bfloat16, init_method_std=0.02, gradient_accumulation_fusion=False,
                  deterministic_mode=True)
    if moe:
        kwargs.update(num_layers=4, num_moe_experts=4, moe_router_topk=2, moe_grouped_gemm=True,
                      moe_ffn_hidden_size=1024, moe_token_dispatcher_type="alltoall", moe_aux_loss_coeff=1e-2,
                      moe_router_load_balancing_type="aux_loss")
    if fp8:
        kwargs.update(fp8="e4m3", fp8_recipe="tensorwise")
    if recompute:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return TransformerConfig(**kwargs)


def build(config, libgtp, wire="bf16", fp32_grads=True, seed=1234, fused=False):
    import gtp.megatron as gm
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    gm.reset()
    if libgtp:  # the machinery at G = 1 (what this bench checks); by default a group of one is inert
        gm.use_libgtp(wire=wire, machinery_at_g1=True)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    spec = get_gpt_layer_with_transformer_engine_spec(num_experts=config.num_moe_experts,
                                                      moe_grouped_gemm=bool(config.num_moe_experts))
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)
    # As megatron.training's get_model does: TP defaults on every parameter, the model on the GPU, the
    # BF16 wrapper (it casts the parameters Megatron builds in FP32, e.g. the position embedding, and
    # the first stage's inputs), then DDP built on a side stream.
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import Float16Module
    for param in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    model.cuda(torch.cuda.current_device())
    if fused:  # TE's fused wgrad into main_grad (what gradient_accumulation_fusion asks of TE layers;
        # Megatron's own output layer would need apex for it, so it is set on the TE layers only)
        for module in model.modules():
            if hasattr(module, "fuse_wgrad_accumulation"):
                module.fuse_wgrad_accumulation = True
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=fp32_grads, overlap_grad_reduce=True,
                                               use_distributed_optimizer=True, bucket_size=4_000_000,
                                               check_for_nan_in_grad=True)  # megatron.training's default
    if libgtp:
        gm.check_training(config, ddp_config)
    model = Float16Module(config, model)
    ddp_stream = torch.cuda.Stream()
    ddp_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(ddp_stream):
        model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    torch.cuda.current_stream().wait_stream(ddp_stream)
    if libgtp:  # what Megatron's training loop calls after the build and the DDP wrap
        from megatron.core.tensor_parallel.gtp_api import classify_gtp_remat_chains
        classify_gtp_remat_chains([model])
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.01, bf16=True,
                                                       params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                                                       clip_grad=1.0), [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    config.grad_scale_func = optimizer.scale_loss
    on_libgtp = sum(isinstance(p, gm.MegatronParameter) for p in model.parameters())
    return model, optimizer, on_libgtp


def batch(index):
    g = torch.Generator().manual_seed(1000 + index)
    tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
    return {"tokens": tokens[:, :-1].cuda(), "labels": tokens[:, 1:].cuda()}


def forward_step(data_iterator, model):
    """Megatron's schedule's forward step for a batch from batch() (bench/megatron/head_to_head.py too):
    causal LM loss, its mean over the microbatch's tokens."""
    data = next(data_iterator)
    micro, seq = data["tokens"].shape
    position_ids = torch.arange(seq, device="cuda").unsqueeze(0).expand(micro, -1)
    mask = torch.ones(1, 1, seq, seq, device="cuda", dtype=torch.bool).triu(1)
    output = model(data["tokens"], position_ids, mask, labels=data["labels"])

    def loss_func(output_tensor):
        loss = output_tensor.float().mean()
        # A copy: the schedule scales the returned loss in place (x cp size / microbatches).
        return loss, {"lm loss": loss.detach().clone()}
    return output, partial(loss_func)


def train(model, optimizer, steps, first_step=0):
    from megatron.core.pipeline_parallel import get_forward_backward_func
    fwd_bwd = get_forward_backward_func()
    losses, norms, times = [], [], []
    for step in range(first_step, first_step + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        data = iter([batch(step * MICROBATCHES + i) for i in range(MICROBATCHES)])
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=[model], num_microbatches=MICROBATCHES,
                      seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        ok, norm, _ = optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if not ok:
            raise RuntimeError(f"step {step}: the optimizer skipped the update")
        losses.append(sum(float(o["lm loss"]) for o in out) / len(out))
        norms.append(float(norm))
    return losses, norms, times


def run(config, libgtp, steps=20, **kw):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, optimizer, on_libgtp = build(config, libgtp, **kw)
    losses, norms, times = train(model, optimizer, steps)
    result = {"libgtp": libgtp, "weights_on_libgtp": on_libgtp, "losses": losses,
              "loss_hex": [x.hex() for x in losses], "grad_norms": norms,
              "step_ms_median": 1e3 * statistics.median(times[3:]), "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
              **{k: str(v) for k, v in kw.items()}}
    release(config)
    del model, optimizer
    collect()
    return result


def release(config):
    """Drops what the config holds of a finished run (its hooks are bound to the model and optimizer),
    so that deleting them frees them and the next run's peak memory counts only itself."""
    config.finalize_model_grads_func = config.no_sync_func = config.grad_scale_func = None


def collect():
    gc.collect()
    torch.cuda.empty_cache()


def compare(a, b, bound=None):
    same = a["loss_hex"] == b["loss_hex"] and a["grad_norms"] == b["grad_norms"]
    rel = max(abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"]))
    verdict = {"bit_identical": same, "max_rel_loss_diff": rel,
               "time_ratio": a["step_ms_median"] / b["step_ms_median"], "peak_ratio": a["peak_mib"] / b["peak_mib"]}
    if bound is not None:
        verdict.update(bound=bound, within_bound=rel <= bound)
    return verdict


def part_pair(config, result, **kw):
    off = run(config, False, **kw)
    gtp = run(config, True, **kw)
    control = run(config, False, **kw)
    result["runs"] += [off, gtp, control]
    verdict = compare(gtp, off)
    verdict["control_off_vs_off_bit_identical"] = compare(control, off)["bit_identical"]
    verdict["weights_on_libgtp"] = gtp["weights_on_libgtp"]
    return verdict


def part_gpt(result, moe=False, recompute=False, variants=("fp32", "bf16", "fused")):
    settings = {"fp32": ("fp32_main_grads", "FP32 main grads", dict(fp32_grads=True)),
                "bf16": ("bf16_main_grads", "BF16 main grads", dict(fp32_grads=False)),
                "fused": ("fused_wgrad_fp32_main_grads", "fused wgrad", dict(fp32_grads=True, fused=True))}
    failures = []
    for variant in variants:
        key, name, kw = settings[variant]
        result[key] = v = part_pair(transformer_config(moe=moe, recompute=recompute), result, **kw)
        if v["weights_on_libgtp"] == 0:
            failures.append(f"{name}: no weight went on libgtp")
        elif not v["bit_identical"]:
            failures.append(f"{name}: libgtp's losses differ from GTP off (max rel {v['max_rel_loss_diff']:.3g}); the "
                            "GTP-off control run " + ("matched GTP off bit for bit" if v["control_off_vs_off_bit_identical"]
                                                      else "differed too: the baseline itself is not deterministic here"))
    assert not failures, "; ".join(failures)


def part_fp8(result):
    off = run(transformer_config(fp8=True), False)
    result["runs"].append(off)
    failures = []
    for wire in ("bf16", "fp8"):
        gtp = run(transformer_config(fp8=True), True, wire=wire)
        result["runs"].append(gtp)
        result[f"wire_{wire}"] = v = compare(gtp, off, FP8_BOUND)
        if not v["within_bound"]:
            failures.append(f"wire {wire}: max rel loss diff {v['max_rel_loss_diff']:.3g} > {FP8_BOUND}")
    assert not failures, "; ".join(failures)


# The distributed optimizer's state in the format megatron.training writes by default: without
# metadata Megatron-Core 0.19 falls back to the deprecated 'fully_sharded_model_space', whose
# flattened ShardedTensors its own torch_dist validation refuses (the H200 run at 54d8290 failed so).
OPTIMIZER_CKPT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def part_ckpt(result):
    from megatron.core import dist_checkpointing
    from megatron.core.utils import unwrap_model
    import gtp.megatron as gm
    config = transformer_config()
    folder = tempfile.mkdtemp(prefix="gtp_megatron_ckpt_")
    model, optimizer, _ = build(config, True)
    first, _, _ = train(model, optimizer, 8)
    model_sd = unwrap_model(model).sharded_state_dict()  # as megatron.training's checkpointing: the GPTModel
    dist_checkpointing.save({"model": model_sd, "optimizer": optimizer.sharded_state_dict(
        model_sd, metadata=OPTIMIZER_CKPT_METADATA)}, folder)
    after, after_norms, _ = train(model, optimizer, 8, first_step=8)
    result["saved_then"] = {"losses": after, "loss_hex": [x.hex() for x in after]}
    release(config)
    del model, optimizer
    collect()
    failures = []
    for libgtp, name in ((True, "libgtp_loads_libgtp"), (False, "gtp_off_loads_libgtp")):
        try:
            config = transformer_config()
            model, optimizer, _ = build(config, libgtp, seed=999)  # other weights until loaded
            model_sd = unwrap_model(model).sharded_state_dict()
            state = dist_checkpointing.load({"model": model_sd, "optimizer": optimizer.sharded_state_dict(
                model_sd, is_loading=True, metadata=OPTIMIZER_CKPT_METADATA)}, folder)
            unwrap_model(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            losses, norms, _ = train(model, optimizer, 8, first_step=8)
            same = [x.hex() for x in losses] == result["saved_then"]["loss_hex"] and norms == after_norms
            result[name] = {"losses": losses, "identical_continuation": same}
            if not same:
                failures.append(f"{name}: continuation differs ({losses} vs {after})")
            release(config)
            del model, optimizer
            collect()
        except Exception as error:  # noqa: BLE001 - each load reported on its own
            result[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
            failures.append(f"{name}: {type(error).__name__}: {error}")
    result["first_losses"] = first
    gm.reset()
    assert not failures, "; ".join(failures)


PARTS = {"gpt": part_gpt, "moe": partial(part_gpt, moe=True), "fp8": part_fp8,
         "recompute": partial(part_gpt, recompute=True, variants=("fp32",)), "ckpt": part_ckpt}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(PARTS), required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args()
    result = {"part": args.part, "commit": args.commit, "runs": [], "ok": False,
              "device": None, "versions": {}}
    try:
        init()
        import megatron.core
        import transformer_engine
        result["device"] = torch.cuda.get_device_name(0)
        result["versions"] = {"torch": torch.__version__, "te": transformer_engine.__version__,
                              "megatron_core": getattr(megatron.core, "__version__", "?")}
        PARTS[args.part](result)
        result["ok"] = True
    except BaseException as error:  # noqa: BLE001 - the JSON says what failed
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
        print(result["traceback"], file=sys.stderr)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    summary = {k: v for k, v in result.items() if k not in ("runs", "traceback")}
    print(json.dumps(summary, indent=1)[:4000])
    for r in result["runs"]:
        print(f"  libgtp={r['libgtp']} fp32_grads={r.get('fp32_grads', '-')} fused={r.get('fused', '-')} "
              f"wire={r.get('wire', '-')}: "
              f"{r['step_ms_median']:.2f} ms/step, peak {r['peak_mib']:.0f} MiB, last loss {r['losses'][-1]:.6f}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()

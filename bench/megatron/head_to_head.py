"""libgtp against Megatron-Core's own GTP, the reference implementation: the same GPTModel (TE layer spec,
Megatron's DDP, distributed optimizer and pipeline schedule), the same data and the same initial
weights, trained three ways on WORLD real NCCL peers sharing one GPU (gtp.shared_gpu; correctness and
counts only, timings mean nothing): GTP off (data parallel over WORLD ranks), Megatron's own GTP at
G = WORLD / TP, and libgtp at G (gtp.megatron.use_libgtp). Per step and rank it records losses, grad
norms and, from NCCL's own log (NCCL_DEBUG_SUBSYS=COLL), every NCCL operation with its bytes; at the end
the parameters each rank owns. Verdicts per variant: libgtp against Megatron bit for bit (losses, grad
norms, parameters), and each GTP run's distance from GTP off (libgtp's no larger than Megatron's).

Megatron's GTP draws its shards' initial values from its own RNG tracker (gtp-anatomy §2.4), so its
shards are overwritten with the GTP-off model's initial rows before the optimizer is built; libgtp
builds each layer full with the GTP-off initialization, which the run checks.

    python3 bench/megatron/head_to_head.py --world 2 --variants gpt,fused --json h2h_g2.json
"""
import argparse
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
from gtp import shared_gpu  # noqa: E402
from megatron_bench import forward_step  # noqa: E402  (beside this file; the schedule's forward step)

SEQ, MICRO, MICROBATCHES, VOCAB, LAYERS, HIDDEN = 256, 2, 2, 4096, 2, 512
IMPLS = ("off", "megatron", "libgtp")
VARIANTS = {  # name: (TransformerConfig overrides, build options)
    "gpt": ({}, {}),
    "fused": ({}, {"fused": True}),          # TE's fused wgrad into main_grad
    "bias": ({"add_bias_linear": True}, {}),
    "recompute": ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, {}),
    "fp8cs": ({"fp8": "e4m3", "fp8_recipe": "tensorwise"}, {}),  # FP8 current scaling, BF16 wire
}
NCCL_OP = re.compile(r"NCCL INFO (\w+): opCount \w+ .*?count (\d+) datatype (\d+) .*?\[nranks=(\d+)\]")
DTYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}  # ncclDataType_t


def config_for(variant):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    kwargs = dict(num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=4 * HIDDEN, num_attention_heads=8,
                  hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
                  pipeline_dtype=torch.bfloat16, init_method_std=0.02, gradient_accumulation_fusion=False,
                  deterministic_mode=True, add_bias_linear=False)
    kwargs.update(VARIANTS[variant][0])
    return TransformerConfig(**kwargs)


def batch(step, rank, mb):
    import torch
    g = torch.Generator().manual_seed(100000 * step + 1000 * rank + mb)
    tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
    return {"tokens": tokens[:, :-1].cuda(), "labels": tokens[:, 1:].cuda()}


def init_parallel(tp, gtp):
    from megatron.core import parallel_state as ps
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, gtp_remat_size=gtp, create_gloo_process_groups=False)


def build(config, impl, seed, fused):
    import torch
    import gtp.megatron as gm
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import gtp_api
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    gm.reset()
    if impl == "libgtp":
        gm.use_libgtp(wire="bf16")
    if impl != "off":
        gtp_api.configure_gtp_remat_from_recipe(fp8=bool(config.fp8), fp8_recipe=config.fp8_recipe)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                     vocab_size=VOCAB, max_sequence_length=SEQ)
    for param in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    model.cuda(torch.cuda.current_device())
    if fused:
        for module in model.modules():
            if hasattr(module, "fuse_wgrad_accumulation"):
                module.fuse_wgrad_accumulation = True
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                               use_distributed_optimizer=True, bucket_size=4_000_000,
                                               check_for_nan_in_grad=True)
    if impl == "libgtp":
        gm.check_training(config, ddp_config)
    model = Float16Module(config, model)
    ddp_stream = torch.cuda.Stream()
    ddp_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(ddp_stream):
        model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    torch.cuda.current_stream().wait_stream(ddp_stream)
    if impl != "off":
        gtp_api.classify_gtp_remat_chains([model])
    return model, ddp_config


def owned_rows(param, full):
    """The rows of `full` (the GTP-off weight) that a GTP shard holds: padded to the group, this rank's block."""
    import torch
    group_size = param.group.size() if hasattr(param.group, "size") else torch.distributed.get_world_size(param.group)
    rank = torch.distributed.get_rank(param.group)
    rows = param.shape[0]
    padded = torch.zeros((rows * group_size,) + tuple(full.shape[1:]), dtype=full.dtype)
    padded[:full.shape[0]] = full
    return padded[rank * rows:(rank + 1) * rows]


def set_megatron_initial_rows(model, reference):
    """Megatron's GTP shards get the GTP-off model's initial rows (its own RNG tracker drew others)."""
    import torch
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import is_gtp_param
    changed = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_gtp_param(param):
                param.data.copy_(owned_rows(param, reference[name]).to(param.device, param.dtype))
                changed += 1
            else:
                param.data.copy_(reference[name].to(param.device, param.dtype))
    return changed


def nccl_ops(log_path, start):
    """NCCL operations logged since byte `start`: a list of (op, bytes, nranks), and the new end."""
    if not log_path or not os.path.exists(log_path):
        return [], start
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read()
    ops = [(m.group(1), int(m.group(2)) * DTYPE_BYTES.get(int(m.group(3)), 0), int(m.group(4)))
           for m in NCCL_OP.finditer(text.decode(errors="replace"))]
    return ops, start + len(text)


def run(rank, world, variant, impl, args, reference):
    import torch
    import gtp.megatron as gm
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    gtp_size = world // args.tp
    init_parallel(args.tp, 1 if impl == "off" else gtp_size)
    config = config_for(variant)
    model, _ = build(config, impl, seed=1234, fused=VARIANTS[variant][1].get("fused", False))
    initial = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    checks = {}
    if impl == "megatron":
        checks["shards_set_from_off"] = set_megatron_initial_rows(model, reference)
    elif impl == "libgtp":  # libgtp's shards must already hold the GTP-off rows (docs/megatron.md)
        mismatched = [n for n, p in model.named_parameters()
                      if isinstance(p, gm.MegatronParameter) and not torch.equal(initial[n], libgtp_rows(p, reference[n]))]
        checks["libgtp_initial_rows_equal_off"] = not mismatched
        checks["libgtp_weights"] = sum(isinstance(p, gm.MegatronParameter) for p in model.parameters())
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.01, bf16=True,
                                                       params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                                                       clip_grad=1.0), [model],
                                       use_gloo_process_groups=False)  # none are built (as at G > 1)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    config.grad_scale_func = optimizer.scale_loss
    fwd_bwd = get_forward_backward_func()
    log_path = os.environ.get("GTP_H2H_NCCL_LOG")
    _, position = nccl_ops(log_path, 0)
    losses, norms, per_step_ops = [], [], []
    for step in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        data = iter([batch(step, rank, mb) for mb in range(MICROBATCHES)])
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=[model], num_microbatches=MICROBATCHES,
                      seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        ok, norm, _ = optimizer.step()
        torch.cuda.synchronize()
        if not ok:
            raise RuntimeError(f"{impl} {variant} step {step}: the optimizer skipped the update")
        losses.append(sum(float(o["lm loss"]) for o in out) / len(out))
        norms.append(float(norm))
        ops, position = nccl_ops(log_path, position)
        per_step_ops.append(ops)
    final = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    config.finalize_model_grads_func = config.no_sync_func = config.grad_scale_func = None
    gm.reset()
    del model, optimizer
    torch.cuda.empty_cache()
    return {"losses": losses, "loss_hex": [x.hex() for x in losses], "grad_norms": norms, "checks": checks,
            "ops": per_step_ops, "final": final, "initial": initial}


def libgtp_rows(param, full):
    """The rows of `full` a libgtp shard holds (its valid rows; libgtp keeps padding out of the shard)."""
    g = param.geometry
    return full[g.row_start:g.row_start + g.valid_rows]


def rank_main(rank, world, store_dir, args):
    import torch
    torch.cuda.set_device(0)
    store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
    torch.distributed.init_process_group("nccl", store=store, rank=rank, world_size=world)
    results = {}
    for variant in args.variants:
        runs = {}
        reference = None
        for impl in IMPLS:
            start = time.time()
            runs[impl] = run(rank, world, variant, impl, args, reference)
            runs[impl]["seconds"] = time.time() - start
            if impl == "off":
                reference = runs["off"]["initial"]
        results[variant] = summarize_rank(runs, rank)
    torch.distributed.barrier()
    return results


def summarize_rank(runs, rank):
    off, meg, lib = runs["off"], runs["megatron"], runs["libgtp"]

    def rel(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"]))
    param_diff = {}
    for name, p in lib["final"].items():
        q = meg["final"].get(name)
        param_diff[name] = None if q is None or q.shape != p.shape else float((p - q).abs().max())
    identical_params = all(d == 0.0 for d in param_diff.values())
    steps = len(lib["ops"])
    counted = list(range(2, steps))  # after the first two steps (set-up, chains recorded)

    def op_table(run_):
        table = {}
        for s in counted:
            for op, nbytes, nranks in run_["ops"][s]:
                key = f"{op}[nranks={nranks}]"
                entry = table.setdefault(key, {"ops": 0, "bytes": 0})
                entry["ops"] += 1
                entry["bytes"] += nbytes
        return {k: {"ops_per_step": v["ops"] / len(counted), "bytes_per_step": v["bytes"] / len(counted)}
                for k, v in sorted(table.items())}
    return {
        "rank": rank,
        "libgtp_vs_megatron": {"losses_bit_identical": lib["loss_hex"] == meg["loss_hex"],
                               "grad_norms_identical": lib["grad_norms"] == meg["grad_norms"],
                               "params_bit_identical": identical_params,
                               "max_param_abs_diff": max((d for d in param_diff.values() if d is not None), default=None),
                               "params_compared": sum(d is not None for d in param_diff.values())},
        "max_rel_loss_vs_off": {"libgtp": rel(lib, off), "megatron": rel(meg, off)},
        "checks": {**meg["checks"], **lib["checks"]},
        "losses": {impl: runs[impl]["losses"] for impl in IMPLS},
        "grad_norms": {impl: runs[impl]["grad_norms"] for impl in IMPLS},
        "nccl_per_step": {impl: op_table(runs[impl]) for impl in IMPLS},
        "seconds": {impl: runs[impl]["seconds"] for impl in IMPLS},
    }


def _entry(rank, world, store_dir, args, launch_id, log_dir, queue):
    shared_gpu.apply(rank, launch_id)
    if log_dir:
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL",
                          NCCL_DEBUG_FILE=os.path.join(log_dir, f"nccl_rank{rank}.log"))
        os.environ["GTP_H2H_NCCL_LOG"] = os.path.join(log_dir, f"nccl_rank{rank}.log")
    os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    try:
        queue.put((rank, True, rank_main(rank, world, store_dir, args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))


def command_line():
    """The command as run, with the results folder written as $OUT (the device's scratch path is no
    part of the command a reader repeats)."""
    line = " ".join(sys.argv)
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2, help="ranks, all on one GPU (default 2)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (G = world / tp)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", default="gpt", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--json", required=True, help="where the results go")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--no-nccl-log", action="store_true", help="do not count NCCL operations")
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants {','.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if args.world < 2 or args.world % args.tp:
        parser.error(f"--world {args.world} --tp {args.tp}: the world must be >= 2 and a multiple of TP")
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: give at least 3 (operations are counted after the first 2)")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        log_dir = None if args.no_nccl_log else store_dir
        procs = [context.Process(target=_entry, args=(r, args.world, store_dir, args, str(os.getpid()), log_dir, queue))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        got = dict((rank, (ok, value)) for rank, ok, value in (queue.get(timeout=3000) for _ in procs))
        for p in procs:
            p.join(timeout=60)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(got.items()) if not ok]
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    report = {"what": "libgtp vs Megatron-Core's own GTP vs GTP off, real NCCL peers on one GPU",
              "world": args.world, "tp": args.tp, "gtp": args.world // args.tp, "steps": args.steps,
              "commit": args.commit, "command": command_line(),
              "model": {"layers": LAYERS, "hidden": HIDDEN, "seq": SEQ, "micro": MICRO,
                        "microbatches": MICROBATCHES, "vocab": VOCAB},
              "variants": {v: [got[r][1][v] for r in range(args.world)] for v in args.variants}}
    try:
        import torch
        report["card"] = torch.cuda.get_device_name(0)
        report["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    for v in args.variants:
        for r in report["variants"][v]:
            print(v, "rank", r["rank"], json.dumps(r["libgtp_vs_megatron"]), json.dumps(r["max_rel_loss_vs_off"]),
                  json.dumps(r["checks"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

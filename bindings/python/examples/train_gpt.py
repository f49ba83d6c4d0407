#!/usr/bin/env python3
"""A small GPT trained with GTP off, then on (gtp.torch.Linear everywhere, G = world size) with the
BF16, FP8, MXFP8 and NVFP4 wires. N ranks are N processes started here (multiprocessing + a torch
FileStore; no torchrun). CPU: host backend + gloo. GPU: the CUDA backend + NCCL, one GPU per rank.
Prints a JSON summary: losses per run, parity of GTP-on vs GTP-off. See docs/tutorial.md.

--keep-gathered: GTP on keeps every weight gathered from its first forward until the optimizer's
re-pack (the profile's keep_gathered), so the backward reads the forward's slot.

--fill-graphs N: GTP on keeps up to N fills per group as graphs (the profile's fill_graphs): each
distinct prefetch is recorded once and launched afterwards (one cudaGraphLaunch on the CUDA backend).

--reshard-to M: the first wire's run also writes every rank's state dict (shards with their offsets);
they are merged with gtp.torch.consolidate_state_dicts and loaded by M new ranks (G = M), GTP on with
that wire and GTP off, which both train --reshard-steps more steps: each rank's shards must equal the
checkpoint's rows, and the losses must agree within the wire's bound.

--machinery-at-g1: at G = 1 (one rank, or --reshard-to 1) GTP on runs libgtp's machinery; without it a
group of one is inert (the layers are GTP off exactly, gtp.torch.Context's machinery_at_g1).

Parity: every rank reads its own microbatch (GTP peers are data ranks). The GTP-off run averages
gradients in the order libgtp's host reduce-scatter sums them (gtp.ring_mean), and both runs compute
with the BF16 weight, so on CPU the BF16-wire losses are bit-identical to GTP off.
"""
import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gtp  # noqa: E402
import gtp.torch as gt  # noqa: E402
from gtp import shared_gpu  # noqa: E402

# Loss gap to GTP off allowed per wire (max over steps of |loss_on - loss_off| / loss_off). BF16: 0
# on CPU (bit-identical), a GPU's GEMMs may differ run to run. The quantized wires round the weights
# (E4M3: 3 mantissa bits; NVFP4: E2M1 per 16-element block), so training takes a slightly different
# path; the bounds are what this model shows with margin, see docs/tutorial.md.
LOSS_BOUNDS = {"bf16": 0.0, "fp8": 0.02, "mxfp8": 0.02, "nvfp4": 0.08}
GPU_BF16_BOUND = 1e-3


class Block(torch.nn.Module):
    def __init__(self, d, heads, linear):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = linear(d, 3 * d), linear(d, d)
        self.fc1, self.fc2 = linear(d, 4 * d), linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q.matmul(k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attention = scores.masked_fill(mask, float("-inf")).softmax(-1).matmul(v)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, linear):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads, linear) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), linear(d, vocab)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batch(step, data_index, config, device):
    """Learnable token streams (arithmetic sequences mod vocab with random start and stride), one
    microbatch per data rank; the same for GTP off and on."""
    g = torch.Generator().manual_seed(config["seed"] * 100003 + step * 1009 + data_index)
    n, t, vocab = config["micro_batch"], config["seq"] + 1, config["vocab"]
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 5, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(t)) % vocab
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def ordered_mean(tensors):
    """((x0 + x1) + x2 ...) / G: the same order on every rank and in both runs."""
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return total / len(tensors)


def average_gradients(model, world):
    """Data-parallel mean of the gradients libgtp does not reduce. GTP off: the Linear weights too,
    in libgtp's reduce-scatter order (so GTP on and off sum alike)."""
    for module in model.modules():
        params = [p for p in module.parameters(recurse=False) if p.grad is not None]
        for p in params:
            if isinstance(p, gt.ShardedParameter):
                continue  # libgtp reduce-scattered it already
            gathered = [torch.empty_like(p.grad) for _ in range(world)]
            torch.distributed.all_gather(gathered, p.grad)
            if isinstance(module, gt.Linear) and p is module.weight and world > 1:
                rows, cols = p.shape
                g = gtp.shard_geometry(rows, cols, world, 0, module.wire)
                padded = [np.pad(t.cpu().numpy(), ((0, g.padded_rows - rows), (0, 0))) for t in gathered]
                p.grad.copy_(torch.from_numpy(gtp.ring_mean(padded, g.shard_rows)[:rows]))
            else:
                p.grad.copy_(ordered_mean(gathered))


def example_profile(world, keep_gathered=False, fill_graphs=0):
    """A profile for `world` ranks on one host (G = world) whose groups keep their weights gathered
    from the first forward to the next re-pack (docs/remat.md, Keep gathered) and keep up to
    `fill_graphs` fills as graphs (docs/remat.md, Fill graphs)."""
    return {"schema_version": 1,
            "cluster": {"template": {"host_count": 1, "host": {
                "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}],
                "gpus": [{"index": i, "numa_node": 0} for i in range(world)]}}},
            "parallel": {"world_size": world, "tensor_parallel_num_weight_shards": world,
                         "expert_tensor_parallel_num_weight_shards": world},
            "placement": {"on_violation": "warn"},
            "groups": {group: {"keep_gathered": keep_gathered, "fill_graphs": fill_graphs}
                       for group in ("gtp_remat", "expt_gtp_remat")}}


def train(rank, world, config, wire, *, load=None, save=None, first_step=0, steps=None):
    """One run: wire None = GTP off. load: a full state dict to start from (any G); save: a path for
    this rank's state dict after the last step. Returns the losses (mean over data ranks) per step,
    stats, and with load whether every sharded weight holds exactly its rows of the checkpoint."""
    device = cuda_device(rank) if config["backend"] == "cuda" else torch.device("cpu")
    context = None
    if wire is not None:
        profile = None
        if config.get("keep_gathered") or config.get("fill_graphs"):
            profile = json.dumps(example_profile(world, bool(config.get("keep_gathered")), config.get("fill_graphs", 0)))
        context = gt.Context(config["store"], rank, world, backend=config["backend"], device=device,
                             prefetch_depth=2, timeout_s=120, profile_json=profile,
                             machinery_at_g1=bool(config.get("machinery_at_g1")))
    counter = iter(range(1000))

    def linear(i, o):
        return gt.Linear(i, o, context=context, wire=wire or "bf16", device=device, name=f"linear{next(counter)}")

    torch.manual_seed(config["seed"])  # the same initial weights for every run
    model = GPT(config["vocab"], config["d"], config["heads"], config["layers"], config["seq"], linear).to(device)
    shards_match = None
    if load is not None:
        model.load_state_dict(load)
        shards_match = all(torch.equal(m.weight.detach().cpu(), load[name + ".weight"][
            m.weight.geometry.row_start:m.weight.geometry.row_start + m.weight.geometry.valid_rows])
            for name, m in model.named_modules() if isinstance(m, gt.Linear) and m.sharded)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.01)
    if context is not None:
        context.attach_optimizer(optimizer)  # re-pack the wire chunks after every step
    data_index = context.sizes.data_parallel_index if context is not None else rank
    losses, start = [], time.perf_counter()
    steps = config["steps"] if steps is None else steps
    for step in range(first_step, first_step + steps):
        tokens, targets = batch(step, data_index, config, device)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # the context drains at the end of backward (auto_drain)
        average_gradients(model, world)
        optimizer.step()
        gathered = [torch.empty_like(loss) for _ in range(world)]
        torch.distributed.all_gather(gathered, loss.detach())
        losses.append(float(ordered_mean(gathered)))
    seconds = time.perf_counter() - start
    if save is not None:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, save)
    stats = None
    if context is not None:
        s = context.stats()
        stats = {"materialize": s["materialize"], "grads": s["grads"], "groups": s["groups"]}
        context.close()
    result = {"losses": losses, "seconds_per_step": seconds / steps, "stats": stats}
    if shards_match is not None:
        result["shards_match_checkpoint"] = shards_match
    return result


def init_rank(rank, world, store_dir, config):
    torch.set_num_threads(1)
    if config["backend"] == "cuda":
        # Deterministic kernels (cuBLAS needs a fixed workspace for it), so that GTP off and GTP on with
        # the BF16 wire can be compared bit for bit on the GPU too.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.cuda.set_device(cuda_device(rank))
    store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
    backend = "nccl" if config["backend"] == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world)
    return dict(config, store=store)


def checkpoint_path(config, rank):
    return os.path.join(config["checkpoint_dir"], f"rank{rank}.pt")


def rank_main(rank, world, store_dir, config):
    config = init_rank(rank, world, store_dir, config)
    results = {"off": train(rank, world, config, None)}
    for i, wire in enumerate(config["wires"]):
        save = checkpoint_path(config, rank) if config.get("checkpoint_dir") and i == 0 else None
        results[wire] = train(rank, world, config, wire, save=save)
    torch.distributed.destroy_process_group()
    return results


def reshard_main(rank, world, store_dir, config):
    """G = world ranks resume from the merged checkpoint, GTP off and GTP on with the first wire."""
    config = init_rank(rank, world, store_dir, config)
    full = torch.load(os.path.join(config["checkpoint_dir"], "full.pt"))
    kwargs = {"load": full, "first_step": config["steps"], "steps": config["reshard_steps"]}
    results = {"off": train(rank, world, config, None, **kwargs),
               "on": train(rank, world, config, config["wires"][0], **kwargs)}
    torch.distributed.destroy_process_group()
    return results


def reshard(world, config, to_ranks):
    """Merges the `world` ranks' state dicts of the first wire's run, then resumes on `to_ranks`."""
    states = [torch.load(checkpoint_path(config, r)) for r in range(world)]
    torch.save(gt.consolidate_state_dicts(states), os.path.join(config["checkpoint_dir"], "full.pt"))
    return launch(to_ranks, config, target=reshard_main)


def wire_bound(wire, backend):
    return GPU_BF16_BOUND if wire == "bf16" and backend == "cuda" else LOSS_BOUNDS[wire]


def max_relative_gap(losses, reference):
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def summarize_reshard(results, config, from_ranks, to_ranks):
    """The resumed runs at G = to_ranks: shards equal the checkpoint's rows, GTP on within the first
    wire's bound of GTP off."""
    wire, off, on = config["wires"][0], results["off"]["losses"], results["on"]["losses"]
    gap, bound = max_relative_gap(on, off), wire_bound(wire, config["backend"])
    return {"from_g": from_ranks, "to_g": to_ranks, "wire": wire, "first_step": config["steps"],
            "steps": config["reshard_steps"], "shards_match_checkpoint": results["on"]["shards_match_checkpoint"],
            "off_losses": off, "on_losses": on, "bit_identical_to_off": on == off, "max_relative_loss_gap": gap,
            "bound": bound, "within_bound": gap <= bound}


def summarize(results, config):
    off = results["off"]["losses"]
    runs = {"off": {"first_loss": off[0], "last_loss": off[-1], **results["off"]}}
    ok = True
    for wire in config["wires"]:
        losses = results[wire]["losses"]
        gap, bound = max_relative_gap(losses, off), wire_bound(wire, config["backend"])
        within = gap <= bound
        ok &= within
        runs[wire] = {"first_loss": losses[0], "last_loss": losses[-1], "bit_identical_to_off": losses == off,
                      "max_relative_loss_gap": gap, "bound": bound, "within_bound": within, **results[wire]}
    summary = {k: v for k, v in config.items() if k not in ("store", "checkpoint_dir")}
    summary.update({"runs": runs, "parity_ok": ok, "loss_decreased": off[-1] < off[0]})
    return summary


def cuda_device(rank):
    """One GPU per rank, or with --share-gpu the one GPU every rank shares (gtp.shared_gpu)."""
    return torch.device("cuda", shared_gpu.device_index(rank, torch.cuda.device_count()))


def _entry(target, rank, world, store_dir, config, queue):
    if config.get("share_gpu"):  # before NCCL initialises in this process
        shared_gpu.apply(rank, config["share_gpu"])
    try:
        queue.put((rank, target(rank, world, store_dir, config)))
    except BaseException as e:  # noqa: BLE001
        import traceback
        queue.put((rank, RuntimeError(f"rank {rank}: {e}\n{traceback.format_exc()}")))
        raise


def launch(world, config, timeout_s=1800, target=rank_main):
    """Runs target (rank_main) on `world` processes; returns rank 0's results."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        processes = [ctx.Process(target=_entry, args=(target, r, world, store_dir, config, queue))
                     for r in range(world)]
        for p in processes:
            p.start()
        results = dict(queue.get(timeout=timeout_s) for _ in range(world))
        for p in processes:
            p.join()
    errors = [v for v in results.values() if isinstance(v, Exception)]
    if errors:
        raise errors[0]
    return results[0]


def default_config(**overrides):
    config = {"seed": 1234, "steps": 50, "vocab": 64, "d": 64, "heads": 4, "layers": 2, "seq": 32, "micro_batch": 4,
              "lr": 3e-3, "wires": ["bf16", "fp8", "mxfp8", "nvfp4"],
              "backend": "cuda" if torch.cuda.is_available() else "host"}
    config.update(overrides)
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes = G (default 2)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--wires", default="bf16,fp8,mxfp8,nvfp4")
    parser.add_argument("--backend", choices=["host", "cuda"], default=None, help="default: cuda if a GPU is seen")
    parser.add_argument("--reshard-to", type=int, default=None, metavar="M",
                        help="also resume the first wire's checkpoint at G = M (e.g. ranks / 2), GTP on and off")
    parser.add_argument("--reshard-steps", type=int, default=10, help="steps trained after the re-shard load")
    parser.add_argument("--keep-gathered", action="store_true",
                        help="GTP on keeps each weight gathered from its first forward to the next re-pack")
    parser.add_argument("--fill-graphs", type=int, default=0, metavar="N",
                        help="GTP on keeps up to N fills per group as graphs, launched instead of enqueued (0: off)")
    parser.add_argument("--share-gpu", action="store_true",
                        help="the ranks are real NCCL peers on ONE GPU (gtp.shared_gpu; correctness only, timings "
                             "mean nothing: docs/real-peers.md)")
    parser.add_argument("--machinery-at-g1", action="store_true",
                        help="at G = 1 run libgtp's machinery (default: a group of one is inert, GTP off exactly)")
    parser.add_argument("--json", help="also write the summary to this file")
    args = parser.parse_args()
    overrides = {"steps": args.steps, "wires": [w for w in args.wires.split(",") if w],
                 "keep_gathered": args.keep_gathered, "fill_graphs": args.fill_graphs,
                 "machinery_at_g1": args.machinery_at_g1}
    if args.backend:
        overrides["backend"] = args.backend
    if args.share_gpu:
        overrides["share_gpu"] = str(os.getpid())  # the launch id: distinct NCCL host ids per job
    if args.fill_graphs < 0:
        parser.error(f"--fill-graphs {args.fill_graphs}: give 0 (off) or the most fill graphs per group")
    if args.reshard_to is not None and args.reshard_to < 1:
        parser.error(f"--reshard-to {args.reshard_to}: give a number of ranks >= 1")
    if args.reshard_to is not None and not overrides["wires"]:
        parser.error("--reshard-to needs a wire in --wires (the first one's run is checkpointed)")
    config = default_config(**overrides, ranks=args.ranks)
    if args.reshard_to is None:
        summary = summarize(launch(args.ranks, config), config)
    else:
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            config.update(checkpoint_dir=checkpoint_dir, reshard_steps=args.reshard_steps)
            summary = summarize(launch(args.ranks, config), config)
            summary["reshard"] = summarize_reshard(reshard(args.ranks, config, args.reshard_to), config, args.ranks,
                                                   args.reshard_to)
        summary["parity_ok"] &= summary["reshard"]["within_bound"] and summary["reshard"]["shards_match_checkpoint"]
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if summary["parity_ok"] and summary["loss_decreased"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A stack of real TransformerEngine layers with libgtp (G = 1, CUDA backend) against the same stack
without it, in one process, alternating steps: median step time, the ratio, and peak memory.

A step is `microbatches` forward + backward passes through L te.Linear(H, H) layers (BF16 parameters,
fuse_wgrad_accumulation into FP32 main grads, as Megatron-Core runs TE), then, with libgtp, the re-pack
an optimizer step triggers (shard_updated). The optimizer's own work, the same on both sides, is left
out; with --declare-zeroed on the GTP side then declares its zeroed main grads (ctx.main_grads_zeroed()),
so each step's first wgrads are written straight into them. Modes: "bf16" (no TE quantization, BF16 wire) and "fp8" (TE's Float8CurrentScaling; with libgtp
the FP8 wire, whose codes TE's FP8 GEMMs take as they are). keep: the profile's keep_gathered.
Needs a GPU and TE. Usage: te_stack_bench.py --json out.json --commit SHA [--layers 8 --hidden 8192 ...]."""
import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import gtp.torch as gt  # noqa: E402


def profile(keep, stream_priority="high"):
    return json.dumps({"schema_version": 1,
                       "cluster": {"template": {"host_count": 1, "host": {
                           "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}], "gpus": [{"index": 0, "numa_node": 0}]}}},
                       "parallel": {"world_size": 1}, "placement": {"on_violation": "warn"},
                       "groups": {"gtp_remat": {"keep_gathered": keep, "stream_priority": stream_priority}}})


def build(te, layers, hidden):
    torch.manual_seed(0)
    stack = torch.nn.Sequential(*[te.Linear(hidden, hidden, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
                                  for _ in range(layers)])
    for layer in stack:
        layer.weight.main_grad = torch.zeros_like(layer.weight, dtype=torch.float32)
    return stack


def step(te, recipe, stack, xs, ctx, declare_zeroed=False):
    for x in xs:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = stack(x)
        y.float().square().mean().backward()
    if ctx is not None:
        ctx.shard_updated()  # what an optimizer step triggers: the FP8 wire re-packs here
    for layer in stack:
        layer.weight.main_grad.zero_()
    if ctx is not None and declare_zeroed:
        ctx.main_grads_zeroed()  # the next step's first wgrads are written straight into them (no add)


def timed(fn):
    """(milliseconds, bytes the step's torch allocations peaked above what was allocated before it)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, torch.cuda.max_memory_allocated() - before


def run_config(te, args, mode, microbatches, keep, store_dir, declare_zeroed=True):
    from transformer_engine.common import recipe as te_recipe
    recipe = te_recipe.Float8CurrentScaling() if mode == "fp8" else None
    wire = "fp8" if mode == "fp8" else "bf16"
    xs = [torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(microbatches)]
    plain = build(te, args.layers, args.hidden)
    store = torch.distributed.FileStore(os.path.join(store_dir, f"{mode}{microbatches}{keep}{declare_zeroed}"), 1)
    ctx = gt.Context(store, 0, 1, backend="cuda", prefetch_depth=args.depth, profile_json=profile(keep, args.stream_priority))
    sharded = build(te, args.layers, args.hidden)
    gt.te.distribute(sharded, ctx, wire=wire)
    times, peaks = {"off": [], "on": []}, {"off": 0, "on": 0}
    for i in range(args.warmup + args.steps):
        for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
            ms, peak = timed(lambda: step(te, recipe, plain, xs, None) if side == "off" else
                             step(te, recipe, sharded, xs, ctx, declare_zeroed))
            peaks[side] = max(peaks[side], peak)
            if i >= args.warmup:
                times[side].append(ms)
    stats = ctx.stats()
    group = next(g for g in stats["groups"] if g["name"] == "gtp_remat")
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    result = {"mode": mode, "wire": wire, "microbatches": microbatches, "keep_gathered": keep,
              "declare_zeroed": declare_zeroed, "zeroed_handouts": stats["grads"]["zeroed_handouts"],
              "step_ms_off": off, "step_ms_on": on, "step_ratio": on / off,
              "step_ms_off_all": times["off"], "step_ms_on_all": times["on"],
              # Peak memory of a step beyond the model: torch's transient allocations, plus on the GTP side
              # everything libgtp holds (cache slots, grad buffers, wire chunks; its own cudaMalloc).
              "step_peak_bytes_off": peaks["off"], "step_peak_bytes_on_torch": peaks["on"],
              "libgtp_peak_bytes": stats["memory"]["peak_bytes"], "cache_slots": group["slots"],
              "slot_bytes": group["slot_bytes"], "materializations": group["materializations"],
              "prefetch_hits": group["prefetch_hits"], "kept_hits": group["kept_hits"],
              "exposed_gathers": group["exposed_gathers"]}
    ctx.close()
    del plain, sharded
    torch.cuda.empty_cache()
    return result


def command_line():
    """The command as run, with the results folder written as $OUT (the device's scratch path is no
    part of the command a reader repeats)."""
    line = " ".join(sys.argv)
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per microbatch")
    parser.add_argument("--microbatches", default="1,4")
    parser.add_argument("--keep", default="off,on")
    parser.add_argument("--modes", default="bf16,fp8")
    parser.add_argument("--declare-zeroed", default="on",
                        help="on, off or on,off: the GTP side declares its main grads zero after zeroing them "
                             "(ctx.main_grads_zeroed()), so each step's first wgrads need no add")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--stream-priority", default="high", choices=["high", "normal", "low"],
                        help="the gtp_remat group's gather-stream priority (profile stream_priority)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    for name in ("layers", "hidden", "tokens", "depth", "steps"):
        if getattr(args, name) < (0 if name in ("depth",) else 1):
            parser.error(f"--{name} {getattr(args, name)} must be positive")
    declare = [d.strip() for d in args.declare_zeroed.split(",")]
    if not declare or any(d not in ("on", "off") for d in declare):
        parser.error(f"--declare-zeroed {args.declare_zeroed!r}: use on, off or on,off")
    if not torch.cuda.is_available():
        sys.exit("te_stack_bench: no CUDA device (this benchmark runs TE on a GPU)")
    import transformer_engine.pytorch as te
    results = []
    with tempfile.TemporaryDirectory() as store_dir:
        for mode in args.modes.split(","):
            for microbatches in [int(m) for m in args.microbatches.split(",")]:
                for keep, zeroed in [(k == "on", d == "on") for k in args.keep.split(",") for d in declare]:
                    r = run_config(te, args, mode, microbatches, keep, store_dir, zeroed)
                    print(f"{mode:5s} B={microbatches} keep={'on ' if keep else 'off'} "
                          f"zeroed={'on ' if zeroed else 'off'}: off {r['step_ms_off']:.2f} ms, "
                          f"on {r['step_ms_on']:.2f} ms, ratio {r['step_ratio']:.4f}, slots {r['cache_slots']}, "
                          f"exposed {r['exposed_gathers']}", flush=True)
                    results.append(r)
    doc = {"benchmark": "te_stack_bench", "machine": torch.cuda.get_device_name(), "commit": args.commit,
           "command": command_line(), "torch": torch.__version__, "transformer_engine": importlib.metadata.version("transformer_engine"),
           "layers": args.layers, "hidden": args.hidden, "tokens_per_microbatch": args.tokens, "depth": args.depth,
           "stream_priority": args.stream_priority, "declare_zeroed": args.declare_zeroed,
           "steps": args.steps, "warmup": args.warmup, "configs": results}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

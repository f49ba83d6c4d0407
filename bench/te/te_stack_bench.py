#!/usr/bin/env python3
"""A stack of real TransformerEngine layers at G = 1 (CUDA backend), several sides in one process,
stepped in a shuffled order each round: median step time per side, ratios to GTP off, memory, and the
host time GTP code spends per weight per microbatch.

Sides (--sides):
  off          TE alone
  off_control  a second, identical TE-alone stack: its ratio to "off" is the run's noise floor
  off_ctx      TE alone beside a live libgtp CUDA Context built as inert's (NCCL communicators of one
               rank, side streams, fill-tag memory) that no step calls: what the Context's existence costs
  inert        the stack through gt.te.distribute on a default context (machinery_at_g1=False): TE's
               layers are left as they are, the step calls ctx.shard_updated() / main_grads_zeroed()
               (no libgtp call when nothing is registered); inert / off_ctx - 1 is the per-step Python
  machinery    the same with machinery_at_g1=True: every weight gathered through libgtp's size-1 group,
               its wgrad through libgtp's grad buffer and finalize
  megatron     Megatron-Core 0.19.2's own GTP forced to run its machinery at G = 1 (bench/megatron/megatron_gtp_g1.py:
               attached to the te.Linear layers, TE's size-1 gather / reduce-scatter replaced in
               Megatron's module by ones that run the NCCL collective into Megatron's buffers); needs
               megatron-core and a torch.distributed NCCL group of one (made here); BF16 shards, so
               under FP8 it gathers BF16 and TE quantizes, where libgtp's machinery gathers the FP8 wire
A step is `microbatches` forward + backward passes through L te.Linear(H, H) layers (BF16 parameters,
fuse_wgrad_accumulation into FP32 main grads, as Megatron-Core runs TE), then what an optimizer step
triggers on a libgtp side (ctx.shard_updated(): the wire's re-pack with the machinery); the optimizer's
own work, the same on every side, is left out. With --declare-zeroed on the libgtp sides then declare
their zeroed main grads (ctx.main_grads_zeroed()), so the machinery's first wgrads of a step are
written straight into them. Modes: "bf16" (no TE quantization, BF16 wire) and "fp8" (TE's
Float8CurrentScaling; libgtp's machinery gathers the FP8 wire, whose codes TE's FP8 GEMMs take as they
are). keep: the profile's keep_gathered. After --steps measured steps, more are taken (up to
--max-steps) while the control's spread |off_control / off - 1| is --control-target or more.
Before timing, one step per side checks parity: losses and main grads against off's (the megatron side
must match, or its monkeypatch is wrong and the run stops). After timing, --host-steps steps per GTP side
time each DistributedWeight call (and libgtp's drain / shard_updated) with time.perf_counter: host
microseconds per weight per microbatch. Python's garbage collector runs between rounds, not inside a
timed step (--gc on: where it falls).
Needs a GPU and TE (skips, saying so, without CUDA). Usage: te_stack_bench.py --json out.json --commit SHA."""
import argparse
import gc
import importlib.metadata
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "bindings", "python"))
sys.path.insert(0, os.path.join(_HERE, "..", "megatron"))  # megatron_gtp_g1 (the megatron side)
sys.path.insert(0, os.path.join(_HERE, "..", "python"))    # host_timer
import gtp.torch as gt  # noqa: E402
from host_timer import HostTimer  # noqa: E402

SIDES = ("off", "off_control", "off_ctx", "inert", "machinery", "megatron")
DEFAULT_SIDES = ("off", "off_control", "inert", "machinery")  # what tools/gpu step te_stack has always stepped
LIBGTP_SIDES = ("off_ctx", "inert", "machinery")  # the sides with a libgtp Context
GTP_SIDES = ("inert", "machinery", "megatron")     # the sides whose stack goes through a GTP
PROTOCOL = ("materialize_group_for_forward", "materialize_group_for_backward", "grad_buffer", "finalize_group_grads")
LOSS_BOUND = 1e-5   # megatron side: |loss / off's - 1| (the same BF16 weights reach the same GEMMs)
GRAD_BOUND = 1e-3   # megatron side: max |main_grad - off's| / max |off's|
# What the G = 1 run is expected to show, written before it (issue 41 parts 1 and 2); --prediction replaces it.
PREDICTION = ("off_ctx / off and inert / off within the control's spread (the Context's NCCL comms, streams and "
              "fill tags cost no GPU time; the inert step makes no libgtp call), so the 1.78 % BF16 / 2.13 % FP8 "
              "measured at a99cc57 was the old rotation's fixed predecessor order (inert always after off_control, "
              "off always after machinery) plus noise; machinery / off about 1.07 BF16, 1.14 FP8 wire (H100, "
              "keep on, B = 4); megatron / off about 1.02-1.04 BF16 (a copy per gather and reduce-scatter, async on "
              "side streams) and 1.04-1.08 FP8 (TE quantizes the gathered BF16 weight each pass): libgtp's "
              "overhead above 0.8x Megatron's in BF16 (target not met) until its size-1 gather stops copying; "
              "host time per weight per microbatch: libgtp 60-120 us, megatron 80-200 us; megatron's model "
              "memory lower (libgtp keeps an FP32 staging main grad per weight)")


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


def step(te, recipe, stack, xs, ctx, declare_zeroed=False, losses=None, zero=True):
    """One optimizer step's passes; losses: a list to append each microbatch's loss tensor to; zero=False
    leaves the main grads as the step left them (the parity check reads them)."""
    for x in xs:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = stack(x)
        loss = y.float().square().mean()
        loss.backward()
        if losses is not None:
            losses.append(loss.detach())
    if ctx is not None:
        ctx.shard_updated()  # what an optimizer step triggers: the FP8 wire re-packs here
    if not zero:
        return
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


class Side:
    """One side's stack, its libgtp Context (None where it has none), and its GTP weights."""

    def __init__(self, name, stack, ctx, weights):
        self.name, self.stack, self.ctx, self.weights = name, stack, ctx, weights

    def step_ctx(self):
        """The context a step talks to: none for off_ctx (its Context only exists)."""
        return self.ctx if self.name in GTP_SIDES else None


def make_side(te, args, side, wire, keep, store_dir, tag):
    """A Side; the libgtp sides' stacks go through gt.te.distribute, megatron's through Megatron's GTP."""
    stack = build(te, args.layers, args.hidden)
    if side == "megatron":
        import megatron_gtp_g1
        return Side(side, stack, None, megatron_gtp_g1.attach_te_stack(stack, megatron_group()))
    if side not in LIBGTP_SIDES:
        return Side(side, stack, None, [])
    store = torch.distributed.FileStore(os.path.join(store_dir, f"{side}{tag}"), 1)
    ctx = gt.Context(store, 0, 1, backend="cuda", prefetch_depth=args.depth,
                     profile_json=profile(keep, args.stream_priority), machinery_at_g1=side == "machinery")
    created = gt.te.distribute(stack, ctx, wire=wire) if side != "off_ctx" else []
    if (len(created) > 0) != (side == "machinery"):
        raise RuntimeError(f"side {side}: distribute put {len(created)} weights on libgtp at G = 1")
    return Side(side, stack, ctx, created)


_GROUP = []


def megatron_group():
    """A torch.distributed NCCL group of this one rank (the process group made on first use)."""
    if not _GROUP:
        if not torch.distributed.is_initialized():
            store_dir = tempfile.mkdtemp(prefix="te_stack_pg")
            torch.distributed.init_process_group("nccl", init_method=f"file://{store_dir}/pg", rank=0, world_size=1,
                                                 device_id=torch.device("cuda", torch.cuda.current_device()))
        _GROUP.append(torch.distributed.new_group([0]))
    return _GROUP[0]


def spread(times):
    """Relative half inter-quartile range of one side's step times."""
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / 2 / statistics.median(times)


def parity(te, recipe, built, xs):
    """One step per side, main grads kept: each side's losses and main grads against off's. Also returns
    the torch memory each side's first step kept (Megatron's gather / reduce-scatter cache, its wgrad pool)."""
    seen, kept = {}, {}
    for name, side in built.items():
        losses = []
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        step(te, recipe, side.stack, xs, side.step_ctx(), losses=losses, zero=False)
        torch.cuda.synchronize()
        seen[name] = ([float(v) for v in losses], [layer.weight.main_grad.detach().clone() for layer in side.stack])
        for layer in side.stack:
            layer.weight.main_grad.zero_()
        if side.step_ctx() is not None:
            side.ctx.main_grads_zeroed()
        torch.cuda.synchronize()
        kept[name] = torch.cuda.memory_allocated() - before - sum(
            g.numel() * g.element_size() for g in seen[name][1])
    ref_losses, ref_grads = seen["off"]
    result = {}
    for name, (losses, grads) in seen.items():
        loss_rel = max(abs(a / b - 1) for a, b in zip(losses, ref_losses))
        grad_rel = max(float((g - r).abs().max() / r.abs().max().clamp_min(1e-30)) for g, r in zip(grads, ref_grads))
        result[name] = {"losses": losses, "max_loss_rel": loss_rel, "max_main_grad_rel": grad_rel}
    if "megatron" in result and not (result["megatron"]["max_loss_rel"] <= LOSS_BOUND
                                     and result["megatron"]["max_main_grad_rel"] <= GRAD_BOUND):
        raise RuntimeError(f"megatron side differs from GTP off ({result['megatron']}): its machinery at G = 1 "
                           "(megatron_gtp_g1) is not what GTP off computes, so its timings would mean nothing")
    return result, kept


def host_time(te, recipe, side, xs, steps, declare_zeroed):
    """Host microseconds per weight per microbatch in GTP code over `steps` steps: each
    DistributedWeight call TE makes, and libgtp's drain and shard_updated."""
    timer = HostTimer()
    for w in side.weights:
        for name in PROTOCOL:
            timer.wrap(w, name)
    if side.ctx is not None and side.name == "machinery":
        timer.wrap(side.ctx, "drain")
        timer.wrap(side.ctx, "shard_updated")
    for _ in range(steps):
        step(te, recipe, side.stack, xs, side.step_ctx(), declare_zeroed)
    torch.cuda.synchronize()
    timer.unwrap()
    per = max(1, len(side.weights) * len(xs) * steps)
    us = {k: v * 1e6 / per for k, v in timer.seconds.items()}
    return {"us_per_weight_per_microbatch": us, "total_us": sum(us.values()), "calls": timer.calls, "steps": steps}


def run_config(te, args, sides, mode, microbatches, keep, store_dir, declare_zeroed=True):
    from transformer_engine.common import recipe as te_recipe
    recipe = te_recipe.Float8CurrentScaling() if mode == "fp8" else None
    wire = "fp8" if mode == "fp8" else "bf16"
    xs = [torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(microbatches)]
    built, model_bytes = {}, {}
    for side in sides:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        built[side] = make_side(te, args, side, wire, keep, store_dir, f"{mode}{microbatches}{keep}{declare_zeroed}")
        torch.cuda.synchronize()
        model_bytes[side] = torch.cuda.memory_allocated() - before
    checked, kept = parity(te, recipe, built, xs)
    for side in sides:  # with what the first step allocated to keep
        model_bytes[side] += kept[side]
    times, peaks = {s: [] for s in sides}, {s: 0 for s in sides}
    rng = random.Random(args.seed)
    i = 0
    gc_between = args.gc == "between-rounds"
    while True:
        if args.order == "shuffle":
            order = list(sides)
            rng.shuffle(order)  # no side always follows the same one
        else:
            order = sides[i % len(sides):] + sides[:i % len(sides)]
        if gc_between:
            gc.collect()
            gc.disable()
        for side in order:
            s = built[side]
            ms, peak = timed(lambda: step(te, recipe, s.stack, xs, s.step_ctx(), declare_zeroed))
            peaks[side] = max(peaks[side], peak)
            if i >= args.warmup:
                times[side].append(ms)
        if gc_between:
            gc.enable()
        i += 1
        measured = i - args.warmup
        if measured < args.steps:
            continue
        control = (abs(statistics.median(times["off_control"]) / statistics.median(times["off"]) - 1)
                   if "off_control" in sides else 0.0)
        if control < args.control_target or measured >= args.max_steps:
            break
    medians = {s: statistics.median(times[s]) for s in sides}
    result = {"mode": mode, "wire": wire, "microbatches": microbatches, "keep_gathered": keep,
              "declare_zeroed": declare_zeroed, "steps_measured": i - args.warmup,
              "step_ms": medians, "ratio_to_off": {s: medians[s] / medians["off"] for s in sides},
              # The GPU time a side adds to a step: its median minus off's.
              "overhead_ms": {s: medians[s] - medians["off"] for s in sides},
              "step_spread": {s: spread(times[s]) for s in sides}, "step_ms_all": times,
              # Peak memory of a step beyond the model: torch's transient allocations (libgtp's own
              # cudaMalloc is in libgtp_peak_bytes).
              "step_peak_bytes": peaks,
              # torch memory the side holds: its stack as built (libgtp's FP32 staging main grads are made
              # there) and what its first step kept (Megatron's cache); libgtp's own cudaMalloc apart
              "model_bytes": {s: model_bytes[s] for s in sides},
              "parity": checked}
    if "off_control" in sides:
        result["control_spread"] = abs(result["ratio_to_off"]["off_control"] - 1)
        result["control_under_target"] = result["control_spread"] < args.control_target
    if "megatron" in sides and "machinery" in sides:
        over = result["overhead_ms"]
        result["machinery_overhead_over_megatron"] = (over["machinery"] / over["megatron"]
                                                      if over["megatron"] > 0 else None)
    result["host"] = {s: host_time(te, recipe, built[s], xs, args.host_steps, declare_zeroed)
                      for s in ("machinery", "megatron") if s in sides and args.host_steps > 0}
    if "megatron" in sides:
        import megatron_gtp_g1
        result["megatron"] = {"megatron_weights": len(built["megatron"].weights),
                              "cache_bytes": megatron_gtp_g1.cache_bytes()}
    for side in LIBGTP_SIDES:
        if side not in sides:
            continue
        ctx = built[side].ctx
        stats = ctx.stats()
        group = next(g for g in stats["groups"] if g["name"] == "gtp_remat")
        result[side] = {"libgtp_weights": len(ctx.parameters), "materializations": group["materializations"],
                        "libgtp_peak_bytes": stats["memory"]["peak_bytes"], "cache_slots": group["slots"],
                        "kept_hits": group["kept_hits"], "exposed_gathers": group["exposed_gathers"],
                        "zeroed_handouts": stats["grads"]["zeroed_handouts"]}
        ctx.close()
    if "machinery" in sides:  # the fields tools/plot_results.py reads (GTP on = the machinery)
        result["step_ratio"] = result["ratio_to_off"]["machinery"]
        result["libgtp_peak_bytes"] = result["machinery"]["libgtp_peak_bytes"]
    if "megatron" in sides:  # its chains and cache hold the stack otherwise
        import megatron_gtp_g1
        megatron_gtp_g1.reset()
    built.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return result


def command_line():
    """The command as run, with the results folder written as $OUT (the device's scratch path is no
    part of the command a reader repeats)."""
    line = " ".join(sys.argv)
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def commit(given):
    if given != "unknown":
        return given
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return given


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per microbatch")
    parser.add_argument("--microbatches", default="1,4")
    parser.add_argument("--keep", default="off,on")
    parser.add_argument("--modes", default="bf16,fp8")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help=f"which of {', '.join(SIDES)} to step ('off' always; megatron needs megatron-core)")
    parser.add_argument("--order", default="shuffle", choices=["shuffle", "rotate"],
                        help="each round's side order: a seeded shuffle (no side always follows the same one) or "
                             "the rotation of earlier runs (each side always after the same one)")
    parser.add_argument("--seed", type=int, default=41, help="the shuffle's seed")
    parser.add_argument("--gc", default="between-rounds", choices=["between-rounds", "on"],
                        help="Python's garbage collector: collected between rounds and off inside them, or as Python runs it")
    parser.add_argument("--host-steps", type=int, default=5,
                        help="steps per machinery / megatron side timing each GTP call on the host (0: none)")
    parser.add_argument("--declare-zeroed", default="on",
                        help="on, off or on,off: the GTP sides declare their main grads zero after zeroing them "
                             "(ctx.main_grads_zeroed()), so each step's first wgrads need no add")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--stream-priority", default="high", choices=["high", "normal", "low"],
                        help="the gtp_remat group's gather-stream priority (profile stream_priority)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per side, at least")
    parser.add_argument("--max-steps", type=int, default=120,
                        help="measured steps per side at most, taken while the control's spread is above target")
    parser.add_argument("--control-target", type=float, default=0.005,
                        help="|median(off_control) / median(off) - 1| to reach before stopping")
    parser.add_argument("--prediction", default=PREDICTION, help="what the run is expected to show (into the JSON)")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    for name in ("layers", "hidden", "tokens", "depth", "steps", "warmup", "max_steps", "host_steps"):
        if getattr(args, name) < (0 if name in ("depth", "warmup", "host_steps") else 1):
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    if args.max_steps < args.steps:
        parser.error(f"--max-steps {args.max_steps} is below --steps {args.steps}")
    if args.steps < 4:
        parser.error(f"--steps {args.steps}: give at least 4 (the spread takes quartiles)")
    sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    if "off" not in sides or any(s not in SIDES for s in sides) or len(set(sides)) != len(sides):
        parser.error(f"--sides {args.sides!r}: name 'off' and any of {', '.join(SIDES[1:])}, each once")
    declare = [d.strip() for d in args.declare_zeroed.split(",")]
    if not declare or any(d not in ("on", "off") for d in declare):
        parser.error(f"--declare-zeroed {args.declare_zeroed!r}: use on, off or on,off")
    if not torch.cuda.is_available():
        sys.exit("te_stack_bench: no CUDA device (this benchmark runs TE on a GPU)")
    import transformer_engine.pytorch as te
    megatron_version = None
    if "megatron" in sides:
        try:
            megatron_version = importlib.metadata.version("megatron-core")
            __import__("megatron_gtp_g1")  # bench/megatron; imports Megatron's GTP module
        except ImportError as e:
            sys.exit(f"te_stack_bench: --sides names megatron but Megatron-Core's GTP does not import ({e}); "
                     "install megatron-core 0.19.2 (tools/constraints.txt) or leave megatron out")
    results = []
    doc = {"benchmark": "te_stack_bench", "machine": torch.cuda.get_device_name(), "commit": commit(args.commit),
           "command": command_line(), "prediction": args.prediction, "torch": torch.__version__,
           "transformer_engine": importlib.metadata.version("transformer_engine"), "megatron_core": megatron_version,
           "sides": list(sides), "order": args.order, "seed": args.seed, "gc": args.gc, "host_steps": args.host_steps,
           "layers": args.layers, "hidden": args.hidden, "tokens_per_microbatch": args.tokens, "depth": args.depth,
           "stream_priority": args.stream_priority, "declare_zeroed": args.declare_zeroed,
           "steps": args.steps, "max_steps": args.max_steps, "control_target": args.control_target,
           "warmup": args.warmup, "configs": results}
    failed = False
    with tempfile.TemporaryDirectory() as store_dir:
        for mode in args.modes.split(","):
            for microbatches in [int(m) for m in args.microbatches.split(",")]:
                for keep, zeroed in [(k == "on", d == "on") for k in args.keep.split(",") for d in declare]:
                    try:
                        r = run_config(te, args, sides, mode, microbatches, keep, store_dir, zeroed)
                    except Exception:  # recorded; the other configurations still run
                        failed = True
                        r = {"mode": mode, "microbatches": microbatches, "keep_gathered": keep,
                             "declare_zeroed": zeroed, "error": traceback.format_exc()}
                        print(f"{mode:5s} B={microbatches}: error\n{r['error']}", flush=True)
                        results.append(r)
                        gc.collect()
                        torch.cuda.empty_cache()
                        continue
                    report(r, sides, mode, microbatches, keep, zeroed)
                    results.append(r)
                    with open(args.json, "w") as f:  # after each configuration: a later failure keeps it
                        json.dump(doc, f, indent=1)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    if failed:
        sys.exit("te_stack_bench: a configuration failed (its error is in the JSON)")


def report(r, sides, mode, microbatches, keep, zeroed):
    ratios = ", ".join(f"{s} {r['ratio_to_off'][s]:.4f}" for s in sides if s != "off")
    print(f"{mode:5s} B={microbatches} keep={'on ' if keep else 'off'} zeroed={'on ' if zeroed else 'off'}: "
          f"off {r['step_ms']['off']:.2f} ms; / off: {ratios}; control spread "
          f"{r.get('control_spread', 0):.4f}; {r['steps_measured']} steps", flush=True)
    if r.get("machinery_overhead_over_megatron") is not None:
        print(f"      machinery overhead / megatron's: {r['machinery_overhead_over_megatron']:.3f} (target <= 0.8)",
              flush=True)
    for side, host in r["host"].items():
        print(f"      host us per weight per microbatch, {side}: {host['total_us']:.1f} "
              + " ".join(f"{k} {v:.1f}" for k, v in host["us_per_weight_per_microbatch"].items()), flush=True)
    print("      model MiB: " + ", ".join(f"{s} {r['model_bytes'][s] / 2**20:.0f}" for s in sides)
          + "; parity max loss rel: " + ", ".join(f"{s} {r['parity'][s]['max_loss_rel']:.1e}" for s in sides),
          flush=True)

if __name__ == "__main__":
    main()

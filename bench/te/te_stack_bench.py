#!/usr/bin/env python3
"""A stack of real TransformerEngine layers at G = 1 (CUDA backend), several sides in one process,
stepped in rotating order: median step time per side, ratios to GTP off, and peak memory.

Sides (--sides): "off" (TE alone), "off_control" (a second, identical TE-alone stack: its ratio to
"off" is the run's noise floor), "inert" (the stack through gt.te.distribute on a default context,
machinery_at_g1=False: TE's layers are left as they are, so it should cost nothing) and "machinery"
(the same with machinery_at_g1=True: every weight gathered through libgtp's size-1 group, its wgrad
through libgtp's grad buffer and finalize). A step is `microbatches` forward + backward passes through
L te.Linear(H, H) layers (BF16 parameters, fuse_wgrad_accumulation into FP32 main grads, as
Megatron-Core runs TE), then what an optimizer step triggers on a GTP side (ctx.shard_updated(): the
wire's re-pack with the machinery, no call when inert); the optimizer's own work, the same on every
side, is left out. With --declare-zeroed on the GTP sides then declare their zeroed main grads
(ctx.main_grads_zeroed()), so the machinery's first wgrads of a step are written straight into them.
Modes: "bf16" (no TE quantization, BF16 wire) and "fp8" (TE's Float8CurrentScaling; the machinery
gathers the FP8 wire, whose codes TE's FP8 GEMMs take as they are; inert, TE quantizes its own weight).
keep: the profile's keep_gathered. After --steps measured steps, more are taken (up to --max-steps)
while the control's spread |off_control / off - 1| is --control-target or more.
Needs a GPU and TE. Usage: te_stack_bench.py --json out.json --commit SHA [--layers 8 --hidden 8192 ...]."""
import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import gtp.torch as gt  # noqa: E402

SIDES = ("off", "off_control", "inert", "machinery")
GTP_SIDES = ("inert", "machinery")
# What the G = 1 run is expected to show, written before it (issue 41 part 1); --prediction replaces it.
PREDICTION = ("inert within 1 % of off (|inert / off - 1| < 0.01, like off_control / off); machinery / off as "
              "measured before the inert default (H100, 0f085a3, B = 4, keep on): about 1.07 BF16, 1.14 FP8 wire")


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


def make_side(te, args, side, wire, keep, store):
    """(stack, context or None) for one side; the GTP sides' stacks go through gt.te.distribute."""
    stack = build(te, args.layers, args.hidden)
    if side not in GTP_SIDES:
        return stack, None
    ctx = gt.Context(store, 0, 1, backend="cuda", prefetch_depth=args.depth,
                     profile_json=profile(keep, args.stream_priority), machinery_at_g1=side == "machinery")
    created = gt.te.distribute(stack, ctx, wire=wire)
    if (len(created) > 0) != (side == "machinery"):
        raise RuntimeError(f"side {side}: distribute put {len(created)} weights on libgtp at G = 1")
    return stack, ctx


def spread(times):
    """Relative half inter-quartile range of one side's step times."""
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / 2 / statistics.median(times)


def run_config(te, args, sides, mode, microbatches, keep, store_dir, declare_zeroed=True):
    from transformer_engine.common import recipe as te_recipe
    recipe = te_recipe.Float8CurrentScaling() if mode == "fp8" else None
    wire = "fp8" if mode == "fp8" else "bf16"
    xs = [torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(microbatches)]
    built = {}
    for side in sides:
        store = torch.distributed.FileStore(os.path.join(store_dir, f"{side}{mode}{microbatches}{keep}{declare_zeroed}"), 1)
        built[side] = make_side(te, args, side, wire, keep, store)
    times, peaks = {s: [] for s in sides}, {s: 0 for s in sides}
    i = 0
    while True:
        order = sides[i % len(sides):] + sides[:i % len(sides)]  # each side in each position equally often
        for side in order:
            stack, ctx = built[side]
            ms, peak = timed(lambda: step(te, recipe, stack, xs, ctx, declare_zeroed))
            peaks[side] = max(peaks[side], peak)
            if i >= args.warmup:
                times[side].append(ms)
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
              "step_spread": {s: spread(times[s]) for s in sides}, "step_ms_all": times,
              # Peak memory of a step beyond the model: torch's transient allocations (libgtp's own
              # cudaMalloc is in libgtp_peak_bytes).
              "step_peak_bytes": peaks}
    if "off_control" in sides:
        result["control_spread"] = abs(result["ratio_to_off"]["off_control"] - 1)
        result["control_under_target"] = result["control_spread"] < args.control_target
    for side in GTP_SIDES:
        if side not in sides:
            continue
        ctx = built[side][1]
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
    built.clear()
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
    parser.add_argument("--sides", default=",".join(SIDES), help=f"which of {', '.join(SIDES)} to step ('off' always)")
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
    for name in ("layers", "hidden", "tokens", "depth", "steps", "warmup", "max_steps"):
        if getattr(args, name) < (0 if name in ("depth", "warmup") else 1):
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
    results = []
    with tempfile.TemporaryDirectory() as store_dir:
        for mode in args.modes.split(","):
            for microbatches in [int(m) for m in args.microbatches.split(",")]:
                for keep, zeroed in [(k == "on", d == "on") for k in args.keep.split(",") for d in declare]:
                    r = run_config(te, args, sides, mode, microbatches, keep, store_dir, zeroed)
                    ratios = ", ".join(f"{s} {r['ratio_to_off'][s]:.4f}" for s in sides if s != "off")
                    print(f"{mode:5s} B={microbatches} keep={'on ' if keep else 'off'} zeroed={'on ' if zeroed else 'off'}: "
                          f"off {r['step_ms']['off']:.2f} ms; / off: {ratios}; {r['steps_measured']} steps",
                          flush=True)
                    results.append(r)
    doc = {"benchmark": "te_stack_bench", "machine": torch.cuda.get_device_name(), "commit": commit(args.commit),
           "command": command_line(), "prediction": args.prediction, "torch": torch.__version__,
           "transformer_engine": importlib.metadata.version("transformer_engine"), "sides": list(sides),
           "layers": args.layers, "hidden": args.hidden, "tokens_per_microbatch": args.tokens, "depth": args.depth,
           "stream_priority": args.stream_priority, "declare_zeroed": args.declare_zeroed,
           "steps": args.steps, "max_steps": args.max_steps, "control_target": args.control_target,
           "warmup": args.warmup, "configs": results}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

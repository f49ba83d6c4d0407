#!/usr/bin/env python3
"""Where the TE stack benchmark's time goes: one configuration of bench/te/te_stack_bench.py stepped
under torch.profiler with libgtp off and on, in one process. Per side: the step's wall time, the time
the GPU was busy (the union of every kernel's and copy's interval over all streams), and the device time
per kernel name (top N), so the step-time gap can be attributed to kernels (extra work), to idle GPU
time (host overhead or waits), or to lost overlap.
Usage: te_stack_profile.py --json out.json [--mode bf16 --microbatches 4 --keep on --steps 3 ...]."""
import argparse
import collections
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import te_stack_bench as bench  # noqa: E402

gt = bench.gt


def busy_union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def device_events(prof):
    """(name, start_us, duration_us) of every kernel and memcpy/memset the profiler saw on the GPU."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.name, e.time_range.start, e.time_range.end - e.time_range.start))
    return out


class HostTimes:
    """Host time spent in gtp.torch's protocol and step calls (outermost call only, so a nested call is
    not counted twice), per method name."""

    def __init__(self):
        self.ms = collections.Counter()
        self.depth = 0

    def wrap(self, cls, name):
        inner = getattr(cls, name)

        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.ms[f"{cls.__name__}.{name}"] += (time.perf_counter() - start) * 1e3
        setattr(cls, name, timed)


HOST = HostTimes()
for _name in ("materialize_group_for_forward", "materialize_group_for_backward", "grad_buffer", "finalize_group_grads"):
    HOST.wrap(gt.ShardedParameter, _name)
for _name in ("drain", "shard_updated"):
    HOST.wrap(gt.Context, _name)


def profile_side(te, recipe, stack, xs, ctx, steps, top, sync_each_step):
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    HOST.ms.clear()
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            bench.step(te, recipe, stack, xs, ctx)
            if sync_each_step:  # as te_stack_bench times a step: nothing queued across its boundary
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    events = device_events(prof)
    per_name = collections.Counter()
    for name, _, dur in events:
        per_name[name] += dur
    busy_ms = busy_union([(s, s + d) for _, s, d in events]) / 1e3 / steps
    kernel_ms = sum(per_name.values()) / 1e3 / steps
    return {"host_ms_per_step": {k: v / steps for k, v in HOST.ms.most_common()},
            "wall_ms_per_step": wall_ms, "gpu_busy_ms_per_step": busy_ms, "device_time_ms_per_step": kernel_ms,
            "top": [{"name": n[:160], "ms_per_step": t / 1e3 / steps} for n, t in per_name.most_common(top)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--mode", default="bf16", choices=["bf16", "fp8"])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--keep", default="on", choices=["on", "off"])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--stream-priority", default="high", choices=["high", "normal", "low"],
                        help="the gtp_remat group's side-stream priority (profile stream_priority)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sync-each-step", action="store_true", help="synchronize after every step, as te_stack_bench does")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("te_stack_profile: no CUDA device (this profiles TE on a GPU)")
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe
    recipe = te_recipe.Float8CurrentScaling() if args.mode == "fp8" else None
    keep = args.keep == "on"
    xs = [torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(args.microbatches)]
    plain = bench.build(te, args.layers, args.hidden)
    with tempfile.TemporaryDirectory() as store_dir:
        store = torch.distributed.FileStore(os.path.join(store_dir, "store"), 1)
        # libgtp's machinery at G = 1 (what this profile looks into; the default there is inert)
        ctx = gt.Context(store, 0, 1, backend="cuda", prefetch_depth=args.depth,
                         profile_json=bench.profile(keep, args.stream_priority), machinery_at_g1=True)
        sharded = bench.build(te, args.layers, args.hidden)
        gt.te.distribute(sharded, ctx, wire="fp8" if args.mode == "fp8" else "bf16")
        for _ in range(args.warmup):
            bench.step(te, recipe, plain, xs, None)
            bench.step(te, recipe, sharded, xs, ctx)
        result = {"off": profile_side(te, recipe, plain, xs, None, args.steps, args.top, args.sync_each_step),
                  "on": profile_side(te, recipe, sharded, xs, ctx, args.steps, args.top, args.sync_each_step)}
        ctx.close()
    doc = {"benchmark": "te_stack_profile", "machine": torch.cuda.get_device_name(), "commit": args.commit,
           "command": bench.command_line(), "mode": args.mode, "microbatches": args.microbatches, "keep_gathered": keep,
           "layers": args.layers, "hidden": args.hidden, "tokens_per_microbatch": args.tokens, "steps": args.steps, "stream_priority": args.stream_priority,
           "sync_each_step": args.sync_each_step, "sides": result}
    for side in ("off", "on"):
        r = result[side]
        print(f"{side}: wall {r['wall_ms_per_step']:.2f} ms, GPU busy {r['gpu_busy_ms_per_step']:.2f} ms, "
              f"device time {r['device_time_ms_per_step']:.2f} ms, host in gtp.torch "
              f"{sum(r['host_ms_per_step'].values()):.2f} ms {dict((k, round(v, 2)) for k, v in r['host_ms_per_step'].items())}")
        for t in r["top"][:12]:
            print(f"   {t['ms_per_step']:8.3f}  {t['name'][:110]}")
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

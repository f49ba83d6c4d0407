#!/usr/bin/env python3
"""Host time of gtp.torch's DistributedWeight path per weight per microbatch (issue 41 part 4), on the
CPU: a gtp.torch.Context on the host backend at G = 1 with its machinery on (machinery_at_g1=True),
L ShardedParameters of a small weight (so libgtp's copies cost next to nothing and what is timed is
Python, ctypes and libgtp's bookkeeping), driven in TE 2.20 Linear's protocol order without TE or
autograd: per microbatch, forward materialize of every weight; then backward, last weight first,
materialize, grad_buffer() (written as TE writes its wgrad: a copy into it) and finalize_group_grads();
then the context's drain (what the end of TE's backward queues). Per step: shard_updated() (what an
optimizer step triggers). Each call is timed with the thread's CPU time (time.thread_time; its own cost is
measured and subtracted); the drain and shard_updated are divided over the weights (and microbatches).

Megatron-Core's GTP Python path cannot run here (it makes CUDA streams and events per weight): the GPU
side of the same measurement is te_stack_bench.py's "host" field (machinery against megatron).

Usage: host_path_bench.py --json out.json [--weights 8 --microbatches 4 --steps 200 --size 64]."""
import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import gtp.torch as gt  # noqa: E402

# This thread's CPU time: the machine this runs on is shared, and wall time would count the waits for a
# core (libgtp's host backend does its G = 1 collectives on the calling thread).
CLOCK = time.thread_time
CALLS = ("materialize_forward", "materialize_backward", "grad_buffer", "finalize", "drain", "shard_updated")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timer_cost(n=200000):
    """Seconds one perf_counter pair costs (subtracted from every timed call)."""
    start = CLOCK()
    for _ in range(n):
        a = CLOCK()
        b = CLOCK()
    del a, b
    return (CLOCK() - start) / n


class TimedLibrary:
    """Stands between a Context and its ctypes library: sums the seconds spent inside libgtp's C calls
    (less the timer's cost), so that the rest of a call's time is Python's."""

    def __init__(self, lib, overhead):
        self._lib, self._overhead, self.seconds, self.calls = lib, overhead, 0.0, 0

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.startswith("gtp_"):
            return fn

        def timed(*args):
            start = CLOCK()
            try:
                return fn(*args)
            finally:
                self.seconds += CLOCK() - start - self._overhead
                self.calls += 1
        return timed


class Rig:
    def __init__(self, store_dir, weights, size, wire):
        store = torch.distributed.FileStore(os.path.join(store_dir, "store"), 1)
        self.ctx = gt.Context(store, 0, 1, backend="host", machinery_at_g1=True, auto_drain=False)
        self.params = []
        for i in range(weights):
            shard = torch.randn(size, size, dtype=torch.bfloat16)
            param = gt.ShardedParameter(shard, self.ctx, f"w{i}", size, size, wire)
            self.params.append(param)
        self.ctx.shard_updated()
        self.wgrad = torch.randn(size, size, dtype=torch.float32)

    def step(self, microbatches, seconds, overhead):
        """One step; adds each call's seconds (less the timer's own cost) into `seconds`."""
        clock = CLOCK

        def timed(name, fn, *args):
            start = clock()
            out = fn(*args)
            seconds[name] += clock() - start - overhead
            return out

        for _ in range(microbatches):
            for p in self.params:
                timed("materialize_forward", p.materialize_group_for_forward)
            for p in reversed(self.params):
                timed("materialize_backward", p.materialize_group_for_backward)
                buffer = timed("grad_buffer", p.grad_buffer)
                buffer.copy_(self.wgrad)  # TE's wgrad GEMM writes it (not GTP code: not timed)
                timed("finalize", p.finalize_group_grads)
            timed("drain", self.ctx.drain)
        timed("shard_updated", self.ctx.shard_updated)


def measure(args, store_dir):
    rig = Rig(store_dir, args.weights, args.size, args.wire)
    overhead = timer_cost()
    seconds = dict.fromkeys(CALLS, 0.0)
    for _ in range(args.warmup):
        rig.step(args.microbatches, dict.fromkeys(CALLS, 0.0), overhead)
    library = rig.ctx._lib = TimedLibrary(rig.ctx._lib, overhead)
    start = CLOCK()
    for _ in range(args.steps):
        rig.step(args.microbatches, seconds, overhead)
    wall = CLOCK() - start
    per = args.weights * args.microbatches * args.steps
    us = {name: seconds[name] * 1e6 / per for name in CALLS}
    c_us, c_calls = library.seconds * 1e6 / per, library.calls / per
    rig.ctx._lib = library._lib
    profile_text = None
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(max(1, args.steps // 4)):
            rig.step(args.microbatches, dict.fromkeys(CALLS, 0.0), overhead)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        profile_text = out.getvalue()
    rig.ctx.close()
    return {"us_per_weight_per_microbatch": us, "total_us": sum(us.values()),
            # inside libgtp's C functions (host backend: its copies and collectives included), and the rest
            "c_us": c_us, "c_calls_per_weight_per_microbatch": c_calls, "python_us": sum(us.values()) - c_us,
            "wall_us_per_weight_per_microbatch": wall * 1e6 / per, "timer_cost_us": overhead * 1e6}, profile_text


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--size", type=int, default=64, help="rows = cols of each weight (small: host time only)")
    parser.add_argument("--wire", default="bf16")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="whole measurements; the JSON keeps each and the median")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions of a few more steps")
    parser.add_argument("--label", default="", help="what this build of the hot path is (into the JSON)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    for name in ("weights", "microbatches", "size", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be at least 1")
    runs = []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as store_dir:
            result, text = measure(args, store_dir)
        runs.append(result)
        if text and r == 0:
            print(text)
    runs_sorted = sorted(runs, key=lambda x: x["total_us"])
    median = runs_sorted[len(runs_sorted) // 2]
    for name in CALLS:
        print(f"{name:22s} {median['us_per_weight_per_microbatch'][name]:7.2f} us per weight per microbatch")
    print(f"{'total':22s} {median['total_us']:7.2f} us (wall {median['wall_us_per_weight_per_microbatch']:.2f}): "
          f"{median['c_us']:.2f} in libgtp's C calls ({median['c_calls_per_weight_per_microbatch']:.2f} calls), "
          f"{median['python_us']:.2f} in Python")
    doc = {"benchmark": "host_path_bench", "cpu": cpu_name(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "torch": torch.__version__, "commit": commit(), "label": args.label, "command": " ".join(sys.argv),
           "library": os.environ.get("GTP_LIBRARY", "bindings/python default"), "backend": "host", "group_size": 1,
           "weights": args.weights, "microbatches": args.microbatches, "size": args.size, "wire": args.wire,
           "steps": args.steps, "median": median, "runs": runs}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()

"""libgtp against Megatron-Core's own GTP, the reference implementation: the same Megatron-Core 0.19.2
GPTModel (TE layer spec, Megatron's DDP, distributed optimizer and pipeline schedules), the same data
and the same initial weights, trained three ways on WORLD real NCCL peers sharing one GPU
(gtp.shared_gpu; correctness and counts only, timings mean nothing): GTP off, Megatron's own GTP and
libgtp (gtp.megatron.use_libgtp), with the same TP / PP / VPP / EP; only G (and EG) differ.

Variants (h2h_plan.VARIANTS): gpt, fused, bias, recompute, fp8cs (world 2 or 4, G = world / TP x PP),
moe (expert GTP EG = 2 on TEGroupedLinear experts, EP 1 at world 2, 2 at world 4), tp2 (TP 2 x G 2)
and pp2vpp (PP 2 x G 2, 2 virtual chunks, interleaved schedule), both world 4; and ckpt: torch_dist
checkpoints across G (saved by Megatron's GTP at G = 4, loaded at G = 2 by off, Megatron and libgtp;
saved by libgtp at G = 2, loaded at G = 4), whatever --world says.

Each variant runs in its own process under --timeout, so one failure or hang keeps the others. Per
variant and rank: the verdict (h2h_compare), losses and grad norms per step, parameter distances,
NCCL's operations and bytes per step (NCCL_DEBUG_SUBSYS=COLL), all-gathers per GTP weight.

    python3 bench/megatron/head_to_head.py --world 4 --variants moe,tp2,pp2vpp --steps 6 --json h2h.json
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2h_compare  # noqa: E402
import h2h_plan  # noqa: E402


def command_line():
    """The command as run, with the results folder written as $OUT (the device's scratch path is no
    part of the command a reader repeats)."""
    line = " ".join(sys.argv)
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def one_variant(name, world, steps, timeout_s, nccl_log):
    """In the variant's own process: its ranks launched, their verdicts gathered."""
    import h2h_ranks
    variant = h2h_plan.VARIANTS[name]
    ranks, failures = h2h_ranks.launch(world, {"kind": "variant", "name": name, "steps": steps},
                                       deadline_s=timeout_s - 15, nccl_log=nccl_log)
    return {"what": variant.what, "world": world, "layout": h2h_plan.layout(variant, world, "libgtp"),
            "verdict": h2h_compare.overall(ranks), "failures": failures, "ranks": ranks}


def one_ckpt(timeout_s):
    """The checkpoint phases (h2h_plan.checkpoint_plan), each its own launch at its world size."""
    import h2h_ranks
    plan = h2h_plan.checkpoint_plan()
    result = {"what": "torch_dist checkpoints across G: " + ", ".join(p["phase"] for p in plan),
              "variant": h2h_plan.CKPT_VARIANT, "steps_before_save": h2h_plan.CKPT_TRAIN,
              "steps_after": h2h_plan.CKPT_CONTINUE, "phases": {}}
    end = time.time() + timeout_s - 15
    verdicts, saved = [], set()
    with tempfile.TemporaryDirectory(prefix="gtp_h2h_ckpt_") as folder:
        for index, phase in enumerate(plan):
            share = h2h_plan.phase_share(plan, index, end - time.time())
            blocker = h2h_plan.phase_blocker(phase, saved, share)
            if blocker:
                entry = {**phase, "verdict": f"failed: not run, {blocker}"}
            else:
                ranks, failures = h2h_ranks.launch(phase["world"], {"kind": "ckpt", "phase": phase, "folder": folder},
                                                   deadline_s=share, nccl_log=False)
                entry = {**phase, "failures": failures, "ranks": ranks}
                if phase["role"] == "load":
                    entry["verdict"] = h2h_compare.overall(ranks)
                elif failures:
                    entry["verdict"] = "failed: " + "; ".join(failures)
                else:
                    saved.add(phase["ckpt"])
                    entry["verdict"] = "saved"
            if entry["verdict"] != "saved":
                verdicts.append(entry["verdict"])
            result["phases"][phase["phase"]] = entry
    result["verdict"] = h2h_compare.overall([{"verdict": v} for v in verdicts])
    return result


def run_isolated(name, args, part_json):
    """The variant in a child process (its own session) under args.timeout; its JSON or why there is none."""
    timeout = args.timeout * (2 if name == "ckpt" else 1)
    command = [sys.executable, os.path.abspath(__file__), "--one", name, "--world", str(args.world),
               "--steps", str(args.steps), "--timeout", str(timeout), "--json", part_json]
    if args.no_nccl_log:
        command.append("--no-nccl-log")
    start = time.time()
    child = subprocess.Popen(command, start_new_session=True)
    try:
        code = child.wait(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child's session: it and the ranks it started
        child.wait()
        code = None
    seconds = time.time() - start
    if os.path.exists(part_json):
        with open(part_json) as f:
            result = json.load(f)
    else:
        why = f"timed out after {timeout + 30} s" if code is None else f"exited {code} without a result"
        result = {"verdict": f"failed: {why} (its log is above)"}
    result["seconds"] = seconds
    return result


def write(report, path):
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def summary_lines(name, result):
    """One line per variant (the runner's verdict pattern matches '^h2h '), one per rank."""
    lines = [f"h2h {name}: {result['verdict']} ({result.get('seconds', 0):.0f} s)"]
    for phase, entry in result.get("phases", {}).items():
        lines.append(f"  {phase}: {entry['verdict']}")
    for r in result.get("ranks", []):
        keys = ("verdict", "max_rel_loss_vs_off", "bound", "gathers")
        lines.append(f"  rank {r.get('rank')}: " + json.dumps({k: r[k] for k in keys if k in r}))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2, choices=(2, 4), help="ranks, all on one GPU (default 2)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per run (default 6; >= 3)")
    parser.add_argument("--variants", default="gpt", help=f"comma-separated, of {', '.join(h2h_plan.VARIANTS)}, ckpt")
    parser.add_argument("--json", required=True, help="where the results go")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per variant (ckpt: twice that)")
    parser.add_argument("--no-nccl-log", action="store_true", help="do not count NCCL operations")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: this process runs one variant
    args = parser.parse_args()
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: give at least 3 (operations are counted from step "
                     f"{h2h_compare.COUNT_FROM_STEP})")
    if args.one:
        result = (one_ckpt(args.timeout) if args.one == "ckpt"
                  else one_variant(args.one, args.world, args.steps, args.timeout, not args.no_nccl_log))
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        return 0
    try:
        names, skipped = h2h_plan.resolve(args.variants, args.world)
    except ValueError as error:
        parser.error(str(error))
    report = {"what": "libgtp vs Megatron-Core's own GTP vs GTP off, real NCCL peers on one GPU",
              "world": args.world, "steps": args.steps, "commit": args.commit, "command": command_line(),
              "model": {"hidden": h2h_plan.HIDDEN, "seq": h2h_plan.SEQ, "micro": h2h_plan.MICRO,
                        "microbatches": h2h_plan.MICROBATCHES, "vocab": h2h_plan.VOCAB},
              "skipped": skipped, "variants": {}}
    import torch
    if names and not torch.cuda.is_available():
        report["error"] = "no CUDA GPU here: the head-to-head trains on one (docs/real-peers.md)"
        write(report, args.json)
        print(f"head_to_head: {report['error']}; nothing run", file=sys.stderr)
        return 1
    if names:
        report["card"] = torch.cuda.get_device_name(0)
        report["torch"] = torch.__version__
    with tempfile.TemporaryDirectory() as parts:
        for name in names:
            print(f"== h2h {name} at world {args.world if name != 'ckpt' else '4 and 2'}", flush=True)
            report["variants"][name] = run_isolated(name, args, os.path.join(parts, f"{name}.json"))
            write(report, args.json)  # after every variant: a later hang keeps what is done
            print("\n".join(summary_lines(name, report["variants"][name])), flush=True)
    write(report, args.json)
    for name, why in skipped.items():
        print(f"h2h {name}: skipped, {why}")
    ok = all(not v["verdict"].startswith("failed") for v in report["variants"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

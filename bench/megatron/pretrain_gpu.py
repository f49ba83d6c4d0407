"""Megatron-LM's own training loop on libgtp against Megatron-Core's own GTP (issue 39).

bench/megatron/pretrain_gpt_mock.py (Megatron-LM's parser, a 2-layer GPT with the TE spec, mock data,
`megatron.training.pretrain`) trains each way: Megatron-Core's GTP, and libgtp through the one line
gtp.megatron.training.enable(). At G = 1 on one process (libgtp with machinery_at_g1, so its machinery
really runs; Megatron's GTP is inert there) and at G = 2 on real NCCL peers sharing the one GPU
(gtp.shared_gpu). Each run trains to iteration 10 (evaluates, saves a torch_dist checkpoint, exits at
Megatron's --exit-interval), then a fresh run loads it and trains to 20 (evaluates at 20 and after
training). Compared between the two backends: per-iteration loss, learning rate, consumed samples and
grad norm, and every evaluation (count, consumed validation samples, loss). Every launch is its own
process (group) with a timeout. Writes --json; exits 0 only when every verdict holds.

    python3 bench/megatron/pretrain_gpu.py --json $OUT/pretrain_gpu.json [--g 1,2] [--commit SHA]

Without CUDA it prints why it skips and exits 0."""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
from gtp import shared_gpu  # noqa: E402

ENTRY = os.path.join(HERE, "pretrain_gpt_mock.py")
BACKENDS = ("megatron", "libgtp")
TRAIN_ITERS, SAVE_AT, EVAL_INTERVAL, EVAL_ITERS = 20, 10, 10, 2
MICRO, GLOBAL = 2, 8
LOSS_BOUND = 1e-2  # relative; the verdict also says whether the losses are bit-identical


def megatron_args(g, save_dir, phase, tied=False):
    args = ["--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "1024", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", str(MICRO),
            "--global-batch-size", str(GLOBAL), "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
            "--lr-warmup-iters", "3", "--lr-decay-iters", str(TRAIN_ITERS), "--train-iters", str(TRAIN_ITERS),
            "--eval-interval", str(EVAL_INTERVAL), "--eval-iters", str(EVAL_ITERS), "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--bf16",
            "--transformer-impl", "transformer_engine", "--tensor-parallel-num-weight-shards", str(g),
            "--use-distributed-optimizer", "--ckpt-format", "torch_dist", "--save", save_dir,
            "--save-interval", str(SAVE_AT), "--log-interval", "1", "--seed", "1234", "--num-workers", "0",
            "--distributed-timeout-minutes", "3"]
    # Megatron-LM ties them by default. At G > 1 Megatron-Core's own GTP fails the tied output layer (its
    # shape check sees the embedding's shard); libgtp runs it (CPU-verified, test_megatron_tied.py).
    if not tied:
        args.append("--untie-embeddings-and-output-weights")
    if phase == "first":
        args += ["--exit-interval", str(SAVE_AT)]
    else:
        args += ["--load", save_dir]
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(g, backend, phase, work, timeout_s, launch_id, tied=False):
    """One Megatron-LM job of G ranks (TP 1), each rank a process; returns (ok, records of rank 0, log tail)."""
    save_dir = os.path.join(work, f"g{g}_{backend}_ckpt")
    record = os.path.join(work, f"g{g}_{backend}_{phase}_rank0.jsonl")
    port = free_port()
    procs, logs = [], []
    for rank in range(g):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(g), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CUDA_DEVICE_MAX_CONNECTIONS="1", NVTE_ALLOW_NONDETERMINISTIC_ALGO="0",
                   PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "bindings", "python"),
                                                            os.environ.get("PYTHONPATH")])))
        if g > 1:
            env.update(shared_gpu.environment(rank, f"{launch_id}-g{g}-{backend}-{phase}"))
        cmd = [sys.executable, ENTRY, *megatron_args(g, save_dir, phase, tied), "--gtp-backend", backend]
        if backend == "libgtp" and g == 1:
            cmd.append("--gtp-machinery-at-g1")
        if rank == 0:
            cmd += ["--gtp-record", record]
        log = open(os.path.join(work, f"g{g}_{backend}_{phase}_rank{rank}.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return {"procs": procs, "logs": logs, "record": record, "deadline": time.time() + timeout_s,
            "command": " ".join(cmd[:2] + ["..."] + cmd[-4:])}


def finish(job):
    codes = []
    for p in job["procs"]:
        try:
            codes.append(p.wait(timeout=max(1.0, job["deadline"] - time.time())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            codes.append("timeout")
    for log in job["logs"]:
        log.close()
    records = []
    if os.path.exists(job["record"]):
        with open(job["record"]) as f:
            records = [json.loads(line) for line in f if line.strip()]
    with open(job["logs"][0].name) as f:
        tail = f.read()[-3000:]
    return {"exit_codes": codes, "ok": all(c == 0 for c in codes), "records": records, "log_tail": tail}


def compare(runs, g):
    """Verdicts for G: both backends ran both phases, resumed at SAVE_AT + 1, and reported equal values."""
    verdict = {}
    seqs = {}
    for backend in BACKENDS:
        first, resume = runs[backend]["first"], runs[backend]["resume"]
        train = [r for r in first["records"] + resume["records"] if r["kind"] == "train"]
        seqs[backend] = {"train": train, "eval": [r for r in first["records"] + resume["records"] if r["kind"] == "eval"]}
        verdict[f"{backend}_ran"] = first["ok"] and resume["ok"]
        verdict[f"{backend}_iterations"] = [r["iteration"] for r in train] == list(range(1, TRAIN_ITERS + 1))
        verdict[f"{backend}_resumed_at_{SAVE_AT + 1}"] = bool(resume["records"]) and \
            next((r["iteration"] for r in resume["records"] if r["kind"] == "train"), None) == SAVE_AT + 1
        # Megatron-LM's own arithmetic: every iteration consumes the global batch over DP x G data ranks.
        verdict[f"{backend}_consumed_is_iteration_x_global_batch"] = all(
            r["consumed_train_samples"] == r["iteration"] * GLOBAL for r in train)
    m, lib = seqs["megatron"], seqs["libgtp"]
    verdict["learning_rates_equal"] = [r["lr"] for r in m["train"]] == [r["lr"] for r in lib["train"]]
    verdict["consumed_samples_equal"] = [r["consumed_train_samples"] for r in m["train"]] == \
        [r["consumed_train_samples"] for r in lib["train"]]
    strip = [(r["consumed_train_samples"], r["consumed_valid_samples"], r["eval_iters"]) for r in m["eval"]]
    verdict["evaluations_equal"] = bool(strip) and strip == [
        (r["consumed_train_samples"], r["consumed_valid_samples"], r["eval_iters"]) for r in lib["eval"]]
    verdict["evaluation_count"] = {b: len(seqs[b]["eval"]) for b in BACKENDS}
    losses = {b: [r["loss"].get("lm loss") for r in seqs[b]["train"]] + [r["loss"].get("lm loss") for r in seqs[b]["eval"]]
              for b in BACKENDS}
    pairs = list(zip(losses["megatron"], losses["libgtp"]))
    comparable = bool(pairs) and len(losses["megatron"]) == len(losses["libgtp"]) and \
        all(a is not None and b is not None for a, b in pairs)
    verdict["losses_bit_identical"] = comparable and all(a == b for a, b in pairs)
    verdict["max_rel_loss_diff"] = max((abs(a - b) / max(abs(a), 1e-12) for a, b in pairs), default=None) \
        if comparable else None
    verdict["losses_within_bound"] = comparable and verdict["max_rel_loss_diff"] <= LOSS_BOUND
    norms = list(zip([r["grad_norm"] for r in m["train"]], [r["grad_norm"] for r in lib["train"]]))
    verdict["grad_norms_bit_identical"] = bool(norms) and all(a == b for a, b in norms)
    keys = [k for k, v in verdict.items() if isinstance(v, bool) and k not in ("losses_bit_identical",
                                                                              "grad_norms_bit_identical")]
    verdict["pass"] = all(verdict[k] for k in keys)
    return verdict, {b: {"train": seqs[b]["train"], "eval": seqs[b]["eval"]} for b in BACKENDS}


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("GTP_COMMIT", "unknown")


def command_line():
    line = " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where the results go")
    parser.add_argument("--g", default="1,2", help="comma-separated G values (ranks on the one GPU), default 1,2")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per launch (default 150)")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--tied", action="store_true",
                        help="tie the embedding and output weights (Megatron-LM's default; at G > 1 Megatron-Core's "
                             "own GTP fails them, libgtp is verified on CPU only)")
    args = parser.parse_args()
    gs = [int(x) for x in args.g.split(",") if x]
    if any(g < 1 for g in gs):
        parser.error(f"--g {args.g}: give G values >= 1")
    import torch
    if not torch.cuda.is_available():
        print("pretrain_gpu.py: SKIP: no CUDA device (Megatron-LM's initialize_megatron requires one)")
        return 0
    started = time.time()
    report = {"what": "Megatron-LM pretrain (megatron-core 0.19.2) on libgtp vs Megatron-Core's own GTP",
              "card": torch.cuda.get_device_name(0), "torch": torch.__version__, "commit": args.commit or commit(),
              "command": command_line(), "loss_bound_rel": LOSS_BOUND, "tied_embeddings": args.tied,
              "model": {"layers": 2, "hidden": 256, "seq": 128, "micro": MICRO, "global": GLOBAL,
                        "train_iters": TRAIN_ITERS, "save_at": SAVE_AT, "eval_interval": EVAL_INTERVAL,
                        "eval_iters": EVAL_ITERS},
              "per_g": {}}
    with tempfile.TemporaryDirectory() as work:
        for g in gs:
            runs = {b: {} for b in BACKENDS}
            for phase in ("first", "resume"):
                # The two backends' jobs run side by side (separate checkpoints, ports, NCCL host ids).
                jobs = {b: launch(g, b, phase, work, args.timeout, str(os.getpid()), args.tied) for b in BACKENDS}
                for b, job in jobs.items():
                    runs[b][phase] = finish(job)
                    runs[b][phase]["command"] = job["command"]
            verdict, seqs = compare(runs, g)
            report["per_g"][str(g)] = {"verdict": verdict, "runs": seqs,
                                       "failures": {f"{b}/{p}": r["log_tail"] for b in BACKENDS
                                                    for p, r in runs[b].items() if not r["ok"]}}
            print(f"G={g}:", json.dumps(verdict))
    report["seconds"] = round(time.time() - started, 1)
    report["pass"] = all(v["verdict"]["pass"] for v in report["per_g"].values())
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print("pretrain_gpu.py:", "PASS" if report["pass"] else "FAIL", f"({report['seconds']} s) ->", args.json)
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

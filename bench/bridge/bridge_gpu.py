"""Megatron Bridge 0.6.2's unmodified pretrain(cfg, forward_step) on libgtp (gtp.bridge), on one GPU, with
gtp.bridge.recipe.tiny_gpt_config (mock data, 20 iterations). Each case runs in its own processes under
a time limit, so one failure loses nothing else; the JSON (--json) holds every case's verdicts and losses.

  dense_g1      GTP off; GTP off again (control: the run is deterministic); libgtp at G = 1 with its
                machinery on (machinery_at_g1: libgtp really gathers and reduces); libgtp at G = 1 by
                default (inert). Losses bit-identical to GTP off.
  ckpt_libgtp   libgtp (machinery on): save at iteration 10 and exit; a fresh run loads it and goes to
  ckpt_off      20 (and the same with GTP off): iterations 1-20 bit-identical to dense_g1's run.
  moe_g1        the MoE variant (4 experts, top-2, grouped GEMM): GTP off and libgtp at G = 1 (machinery).
  g2_peers      2 real NCCL peers sharing the GPU (gtp.shared_gpu): GTP off (DP 2), libgtp at G = 2, and
                Bridge alone at tensor_parallel_num_weight_shards = 2 (what Bridge does without gtp.bridge).
Every run asserts the counts (the CPU tests' definitions): consumed samples and scheduler increments =
iterations x global batch, each evaluation's microbatches = eval_iters x global batch / (micro x DP x G),
and the logged loss of every iteration = the token-weighted mean over every microbatch of every data rank.

    python3 bench/bridge/bridge_gpu.py --json bridge_gpu.json      (GPU; tools/gpu/run.sh bridge)
    python3 bench/bridge/bridge_gpu.py --dry-run                    (CPU: builds and validates every config)
Without CUDA it prints why it skips and writes a JSON saying so."""
import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path[:0] = [os.path.join(ROOT, "bindings", "python"), os.path.join(ROOT, "bindings", "python", "tests"), HERE]

ITERS, GBS, MBS, EVAL_ITERS, SAVE_AT = 20, 8, 2, 2, 10
G2_BOUND = 1e-3  # |loss_libgtp - loss_off| / loss_off at G = 2 (reduction order only; measured value reported)
RUN_TIMEOUT_S = 200
# Bridge's deterministic mode asserts NCCL_ALGO; TE's attention and cuBLAS deterministic too.
DETERMINISTIC_ENV = {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

# run: gtp = off | libgtp | bridge_alone; machinery (libgtp at G = 1); world; moe; ckpt = save | load
CASES = {
    "dense_g1": [{"name": "off", "gtp": "off"}, {"name": "off_control", "gtp": "off"},
                 {"name": "libgtp_machinery", "gtp": "libgtp", "machinery": True},
                 {"name": "libgtp_inert", "gtp": "libgtp"}],
    "ckpt_libgtp": [{"name": "save", "gtp": "libgtp", "machinery": True, "ckpt": "save"},
                    {"name": "resume", "gtp": "libgtp", "machinery": True, "ckpt": "load"}],
    "ckpt_off": [{"name": "save", "gtp": "off", "ckpt": "save"}, {"name": "resume", "gtp": "off", "ckpt": "load"}],
    "moe_g1": [{"name": "off", "gtp": "off", "moe": True},
               {"name": "libgtp_machinery", "gtp": "libgtp", "machinery": True, "moe": True}],
    "g2_peers": [{"name": "off", "gtp": "off", "world": 2}, {"name": "libgtp", "gtp": "libgtp", "world": 2},
                 {"name": "bridge_alone", "gtp": "bridge_alone", "world": 2}],
}


def config_for(run, ckpt_dir=None):
    """The recipe with this run's settings (deterministic, so that runs can be compared bit for bit)."""
    from gtp.bridge.recipe import tiny_gpt_config
    shards = 2 if run.get("world", 1) == 2 and run["gtp"] != "off" else None
    cfg = tiny_gpt_config(moe=run.get("moe", False), train_iters=ITERS, global_batch_size=GBS, micro_batch_size=MBS,
                          num_weight_shards=shards, expert_num_weight_shards=shards if run.get("moe") else None)
    cfg.validation.eval_iters = EVAL_ITERS
    cfg.scheduler.lr_decay_iters = ITERS          # the same schedule for a run that exits at SAVE_AT
    if run.get("deterministic", True):            # --nondeterministic: off_control then says if runs repeat
        cfg.model.deterministic_mode = True
        cfg.model.cross_entropy_loss_fusion = False   # Bridge's deterministic mode refuses the fused one
    if run.get("ckpt") == "save":
        cfg.checkpoint.save, cfg.checkpoint.save_interval, cfg.train.exit_interval = ckpt_dir, SAVE_AT, SAVE_AT
    elif run.get("ckpt") == "load":
        cfg.checkpoint.load = ckpt_dir
    return cfg


def import_bridge():
    """Bridge as a user imports it after gtp.bridge.apply_install_workarounds; where the GPU machine lacks
    the packages Bridge imports at load but this run never uses, named test doubles stand in
    (import_doubles.py; installed before modelopt and Bridge so that both see one consistent world)."""
    from gtp.bridge import install
    import import_doubles
    install.hide_old_nvrx_async()
    import_doubles.install()
    import modelopt.torch.distill  # noqa: F401  (train_step calls its distillation hook)
    from bridge_te_double import import_bridge as import_with_te_or_double
    import_with_te_or_double()
    install.apply_install_workarounds()
    import gtp.bridge
    return gtp.bridge, import_doubles


# ---------------------------------------------------------------- one run (one process per rank)
def run_one(run, result_path):
    import torch
    os.environ.update(DETERMINISTIC_ENV)
    gb, doubles = import_bridge()
    import gtp.megatron as gm
    from megatron.bridge.training import gpt_step
    from megatron.bridge.training.callbacks import Callback
    from megatron.bridge.training.pretrain import pretrain
    from megatron.bridge.training.state import GlobalState
    from megatron.core import parallel_state as ps
    cfg = config_for(run, run.get("ckpt_dir"))
    if run["gtp"] == "libgtp":
        gb.enable(cfg, wire="bf16", machinery_at_g1=run.get("machinery", False))
    out = {"run": run, "rank": int(os.environ.get("RANK", 0)), "train": [], "micro": {"train": [], "eval": [], "test": []},
           "evals": [], "tests": []}
    phase, live = ["train"], {}

    class Recorder(Callback):
        def on_train_start(self, context):
            model = context.model
            live.update(state=context.state, scheduler=context.scheduler)
            out["groups"] = {"g": ps.get_gtp_weight_remat_world_size() or 1,
                             "dp": ps.get_data_parallel_world_size(with_gtp_remat=False),
                             "data_ranks": ps.get_data_parallel_world_size(with_gtp_remat=True)}
            out["libgtp_active"] = gm.active() is not None
            out["libgtp_weights"] = sum(isinstance(p, gm.MegatronParameter) for chunk in model for p in chunk.parameters())
            out["start"] = {"step": context.state.train_state.step,
                            "consumed": context.state.train_state.consumed_train_samples,
                            "scheduler_steps": context.scheduler.num_steps}

        def on_train_step_end(self, context):
            loss = context.loss_dict.get("lm loss") if context.loss_dict else None
            value = float(loss) if loss is not None else None
            out["train"].append({"iteration": context.state.train_state.step + 1, "loss": value,
                                 "hex": value.hex() if value is not None else None,
                                 "grad_norm": None if context.grad_norm is None else float(context.grad_norm)})

        def on_eval_start(self, context):
            phase[0] = "eval"
            out["evals"].append(0)

        def on_eval_end(self, context):
            phase[0] = "train"

        def on_test_start(self, context):
            phase[0] = "test"
            out["tests"].append(0)

        def on_test_end(self, context):
            phase[0] = "train"

    def forward_step(state: GlobalState, data_iterator, model, return_schedule_plan: bool = False):
        """Bridge's own gpt_step.forward_step; its loss function's report (sum, tokens) is recorded."""
        output, loss_function = gpt_step.forward_step(state, data_iterator, model, return_schedule_plan)
        where = phase[0]

        def recording_loss(*args, **kwargs):
            result = loss_function(*args, **kwargs)
            report = result[-1]["lm loss"].detach().float().view(-1).tolist()
            out["micro"][where].append(report)
            if where != "train":
                (out["evals"] if where == "eval" else out["tests"])[-1] += 1
            return result
        return output, recording_loss

    doubles.seal()  # from here on, touching a test double fails the run
    start = time.time()
    try:
        pretrain(cfg, forward_step, callbacks=[Recorder()])
    finally:  # also after Bridge's sys.exit at exit_interval (the save run), which skips on_train_end
        if live:
            ts = live["state"].train_state
            out["end"] = {"step": ts.step, "consumed": ts.consumed_train_samples,
                          "scheduler_steps": live["scheduler"].num_steps, "flops": ts.floating_point_operations_so_far}
        out["seconds"] = time.time() - start
        out["doubles"] = doubles.report()
        out["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        with open(result_path, "w") as f:
            json.dump(out, f)
    if run["gtp"] == "libgtp":
        gb.disable()


# ---------------------------------------------------------------- orchestration (no CUDA in this process)
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(run, folder, timeout_s, fake=False):
    """Starts every rank of one run, waits at most timeout_s; returns the ranks' results or an error."""
    world = run.get("world", 1)
    port, launch_id = free_port(), f"{os.getpid()}-{run['case']}-{run['name']}".replace("_", "-")
    procs = []
    for rank in range(world):
        env = dict(os.environ, **DETERMINISTIC_ENV, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        if world > 1:
            from gtp import shared_gpu
            env.update(shared_gpu.environment(rank, launch_id))
        result = os.path.join(folder, f"{run['case']}.{run['name']}.rank{rank}.json")
        log = open(os.path.join(folder, f"{run['case']}.{run['name']}.rank{rank}.log"), "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--run-one", json.dumps(run), "--result", result]
        if fake:
            cmd.append("--fake")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), result, log))
    deadline, error = time.time() + timeout_s, None
    for proc, _, log in procs:
        try:
            proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s} s"
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        if proc.returncode and not error:
            error = f"rank exited {proc.returncode} (log: {os.path.basename(log.name)})"
    results = []
    for _, path, log in procs:
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
        if error:
            with open(log.name) as f:
                tail = f.read()[-1500:]
            error += f"\n--- {os.path.basename(log.name)} tail:\n{tail}"
    return results, error


def run_case(case, folder, timeout_s, fake, deterministic):
    ckpt_dir = tempfile.mkdtemp(prefix=f"bridge-{case}-", dir=folder)
    runs, errors = {}, {}
    for run in CASES[case]:
        run = dict(run, case=case, ckpt_dir=ckpt_dir, deterministic=deterministic)
        results, error = launch(run, folder, timeout_s, fake)
        runs[run["name"]] = results
        if error:
            errors[run["name"]] = error
            break  # a later run of the case depends on this one
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return runs, errors


def check_counts(rank_results):
    """The CPU tests' definitions of the counts, on every rank of one run; returns failures (strings)."""
    bad = []
    for r in rank_results:
        start, end, data = r.get("start", {}), r.get("end", {}), r.get("groups", {}).get("data_ranks", 1)
        done = end.get("step", 0) - start.get("step", 0)
        if end.get("consumed") != end.get("step", -1) * GBS:
            bad.append(f"rank {r['rank']}: consumed samples {end.get('consumed')} != {end.get('step')} x {GBS}")
        if end.get("scheduler_steps") != end.get("step", -1) * GBS:
            bad.append(f"rank {r['rank']}: scheduler steps {end.get('scheduler_steps')} != {end.get('step')} x {GBS}")
        if len(r["train"]) != done:
            bad.append(f"rank {r['rank']}: {len(r['train'])} logged iterations, {done} trained")
        per_eval = EVAL_ITERS * GBS // (MBS * data)
        for kind in ("evals", "tests"):
            if any(n != per_eval for n in r[kind]):
                bad.append(f"rank {r['rank']}: {kind} microbatches {r[kind]}, expected {per_eval} each (DP x G = {data})")
        if len(r["micro"]["train"]) != done * GBS // (MBS * data):
            bad.append(f"rank {r['rank']}: {len(r['micro']['train'])} train microbatches, expected {done * GBS // (MBS * data)}")
    # The logged loss covers the whole global batch: every data rank's microbatches of that iteration.
    # (ranks of one TP group hold the same loss; at TP 1 every rank is a data rank)
    per_iter = max(1, len(rank_results[0]["micro"]["train"]) // max(1, len(rank_results[0]["train"])))
    for i, logged in enumerate(rank_results[0]["train"]):
        total = tokens = 0.0
        for r in rank_results:
            for loss_sum, count in r["micro"]["train"][i * per_iter:(i + 1) * per_iter]:
                total, tokens = total + loss_sum, tokens + count
        if logged["loss"] is None or tokens == 0 or abs(logged["loss"] - total / tokens) > 1e-5 * abs(total / tokens):
            bad.append(f"iteration {logged['iteration']}: logged loss {logged['loss']} != whole-batch mean "
                       f"{total / tokens if tokens else None}")
            break
    return bad


def losses(rank_results):
    return [t["loss"] for t in rank_results[0]["train"]] if rank_results else []


def hexes(rank_results):
    return [t["hex"] for t in rank_results[0]["train"]] if rank_results else []


def verdicts(case, runs, all_cases):
    v = {}
    if case == "dense_g1" or case == "moe_g1":
        off = hexes(runs.get("off"))
        for name in runs:
            if name != "off":
                v[f"{name}_bit_identical_to_off"] = bool(off) and hexes(runs[name]) == off
        if runs.get("libgtp_machinery"):
            v["machinery_weights_on_libgtp"] = runs["libgtp_machinery"][0].get("libgtp_weights", 0) > 0
        if runs.get("libgtp_inert"):
            v["inert_no_weights_on_libgtp"] = runs["libgtp_inert"][0].get("libgtp_weights", -1) == 0
    elif case in ("ckpt_libgtp", "ckpt_off"):
        ref_name = "libgtp_machinery" if case == "ckpt_libgtp" else "off"
        reference = hexes(all_cases.get("dense_g1", {}).get("runs", {}).get(ref_name))
        joined = hexes(runs.get("save")) + hexes(runs.get("resume"))
        v["saved_at"] = runs["save"][0]["end"]["step"] if runs.get("save") and "end" in runs["save"][0] else None
        v["resumed_from"] = runs["resume"][0]["start"]["step"] if runs.get("resume") and "start" in runs["resume"][0] else None
        v["save_resume_bit_identical_to_uninterrupted"] = (bool(reference) and len(joined) == ITERS
                                                          and joined == reference and v["saved_at"] == SAVE_AT)
        if not reference:
            v["note"] = f"no uninterrupted reference (dense_g1 {ref_name} did not finish)"
    elif case == "g2_peers":
        off, lib, alone = losses(runs.get("off")), losses(runs.get("libgtp")), losses(runs.get("bridge_alone"))
        if off and lib:
            rel = max(abs(a - b) / abs(b) for a, b in zip(lib, off))
            v["libgtp_max_rel_loss_vs_off"] = rel
            v["libgtp_within_bound"] = len(lib) == len(off) == ITERS and rel <= G2_BOUND
            v["libgtp_bit_identical_to_off"] = hexes(runs["libgtp"]) == hexes(runs["off"])
            v["libgtp_g_seen_by_megatron"] = [r["groups"]["g"] for r in runs["libgtp"]]
            v["libgtp_weights"] = [r.get("libgtp_weights") for r in runs["libgtp"]]
            v["libgtp_g2_wired"] = (v["libgtp_g_seen_by_megatron"] == [2, 2]
                                    and all(w and w > 0 for w in v["libgtp_weights"]))
        if alone:
            v["bridge_alone_g_seen_by_megatron"] = [r["groups"]["g"] for r in runs["bridge_alone"]]
            v["bridge_alone_bit_identical_to_off"] = hexes(runs["bridge_alone"]) == hexes(runs.get("off"))
            v["bridge_alone_silently_plain_dp"] = (all(g == 1 for g in v["bridge_alone_g_seen_by_megatron"])
                                                   and v["bridge_alone_bit_identical_to_off"])
        v["megatron_own_gtp"] = ("not run: Bridge 0.6.2 never passes gtp_remat_size to initialize_model_parallel, so "
                                 "Megatron-Core's own GTP cannot run under an unmodified Bridge (bridge_alone shows what "
                                 "it does instead); libgtp is compared with GTP off within G2_BOUND")
        v["g2_bound"] = G2_BOUND
    counts = {name: check_counts(rs) for name, rs in runs.items() if rs}
    v["count_failures"] = {k: c for k, c in counts.items() if c}
    v["counts_ok"] = bool(counts) and not v["count_failures"]
    return v


INFORMATIVE = ("bridge_alone", "libgtp_bit_identical_to_off")  # what Bridge alone does; G = 2 bits: recorded only


def case_ok(v, errors):
    flags = [val for key, val in v.items() if isinstance(val, bool) and not key.startswith(INFORMATIVE)]
    return not any(k != "bridge_alone" for k in errors) and bool(flags) and all(flags)


def orchestrate(args):
    import torch
    meta = {"benchmark": "bridge_gpu", "megatron_bridge": None, "commit": args.commit, "command": command_line(),
            "deterministic": not args.nondeterministic,
            "iterations": ITERS, "global_batch": GBS, "micro_batch": MBS, "eval_iters": EVAL_ITERS}
    try:
        import importlib.metadata
        meta["megatron_bridge"] = importlib.metadata.version("megatron-bridge")
    except Exception as error:  # noqa: BLE001
        meta["megatron_bridge"] = f"not installed: {error}"
    if not torch.cuda.is_available() and not args.fake:
        reason = ("no CUDA device (torch.cuda.is_available() is False): Megatron Bridge's pretrain needs a GPU; "
                  "run `bash tools/gpu/run.sh bridge` on the GPU machine (here: --dry-run checks every config)")
        print(f"SKIP: {reason}")
        write(args.json, dict(meta, skipped=reason, cases={}))
        return 0
    meta["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "fake (no GPU)"
    folder = args.workdir or tempfile.mkdtemp(prefix="bridge-gpu-")
    os.makedirs(folder, exist_ok=True)
    cases = [c for c in (args.cases.split(",") if args.cases else CASES)]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # ckpt cases need dense_g1 only at the end
        futures = {pool.submit(run_case, c, folder, args.timeout, args.fake, not args.nondeterministic): c for c in cases}
        for future in concurrent.futures.as_completed(futures):
            case = futures[future]
            runs, errors = future.result()
            results[case] = {"runs": runs, "errors": errors}
            print(f"== {case}: runs {list(runs)} {'errors: ' + '; '.join(e.splitlines()[0] for e in errors.values()) if errors else 'finished'}")
    report = dict(meta, cases={}, all_passed=True)
    for case in cases:
        runs, errors = results[case]["runs"], results[case]["errors"]
        v = verdicts(case, runs, results)
        ok = case_ok(v, errors)
        report["all_passed"] &= ok
        report["cases"][case] = {"ok": ok, "verdicts": v, "errors": errors,
                                 "losses": {n: losses(rs) for n, rs in runs.items()},
                                 "seconds": {n: max((r.get("seconds", 0) for r in rs), default=None) for n, rs in runs.items()},
                                 "doubles": next((r["doubles"] for rs in runs.values() for r in rs if "doubles" in r), None)}
        print(f"{case}: {'PASS' if ok else 'FAIL'} {json.dumps({k: x for k, x in v.items() if k != 'megatron_own_gtp'})}")
    write(args.json, report)
    print(f"bridge_gpu: {'all cases passed' if report['all_passed'] else 'FAILED'}; {args.json}")
    return 0 if report["all_passed"] else 1


def dry_run():
    """On CPU: every run's config built and validated through Bridge's own runtime_config_update
    (ConfigContainer.validate) and gtp.bridge.check, and the plan printed."""
    os.environ.update(DETERMINISTIC_ENV)
    gb, _ = import_bridge()
    from megatron.bridge.training.config import runtime_config_update
    import megatron.bridge
    print(f"megatron-bridge {megatron.bridge.__version__}; {ITERS} iterations, global batch {GBS}, micro {MBS}")
    for case, runs in CASES.items():
        for run in runs:
            os.environ["WORLD_SIZE"] = str(run.get("world", 1))
            cfg = config_for(run, "/nonexistent/ckpt" if run.get("ckpt") else None)
            cfg.dist.distributed_backend = "gloo"  # no NCCL here; the GPU run keeps Bridge's default
            runtime_config_update(cfg)
            s = gb.check(cfg, run.get("world", 1))
            print(f"{case}.{run['name']}: world {run.get('world', 1)} gtp={run['gtp']} G={s.gtp} EG={s.expert_gtp} "
                  f"DP={s.dp} data ranks={s.data_ranks} microbatches/iter/rank={GBS // (MBS * s.data_ranks)} "
                  f"moe={run.get('moe', False)} ckpt={run.get('ckpt')} validated")
    return 0


def fake_run(run, result_path):
    """The plumbing's test double for a run (--fake): no Bridge, canned results in the run's shape."""
    data = run.get("world", 1)
    per = GBS // (MBS * data)
    first = SAVE_AT if run.get("ckpt") == "load" else 0
    last = SAVE_AT if run.get("ckpt") == "save" else ITERS
    g = 2 if data == 2 and run["gtp"] == "libgtp" else 1
    out = {"run": run, "rank": int(os.environ["RANK"]), "groups": {"g": g, "dp": data // g, "data_ranks": data},
           "libgtp_weights": 10 if run.get("machinery") or data > 1 and run["gtp"] == "libgtp" else 0,
           "start": {"step": first, "consumed": first * GBS, "scheduler_steps": first * GBS},
           "end": {"step": last, "consumed": last * GBS, "scheduler_steps": last * GBS},
           "train": [], "micro": {"train": [], "eval": [], "test": []}, "evals": [EVAL_ITERS * per], "tests": [],
           "seconds": 0.0, "doubles": {"doubled": []}}
    for i in range(first + 1, last + 1):
        loss = 10.0 - i / 8
        out["train"].append({"iteration": i, "loss": loss, "hex": loss.hex(), "grad_norm": 1.0})
        out["micro"]["train"] += [[loss * 100, 100.0]] * per
    with open(result_path, "w") as f:
        json.dump(out, f)


def command_line():
    line = " ".join(sys.argv)
    out = os.environ.get("OUT")
    return line.replace(out, "$OUT") if out else line


def write(path, doc):
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="where the results go")
    parser.add_argument("--commit", default=os.environ.get("GTP_COMMIT", "unknown"))
    parser.add_argument("--cases", help=f"comma-separated, of {', '.join(CASES)} (default all)")
    parser.add_argument("--jobs", type=int, default=len(CASES), help="cases at once (they share the GPU; default all)")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="leave Bridge's deterministic mode off (if an op refuses torch's deterministic algorithms)")
    parser.add_argument("--timeout", type=int, default=RUN_TIMEOUT_S, help="seconds per run (all its ranks)")
    parser.add_argument("--workdir", help="logs and per-rank results (default: a new temporary folder)")
    parser.add_argument("--dry-run", action="store_true", help="build and validate every config (CPU), print the plan")
    parser.add_argument("--fake", action="store_true", help="TEST DOUBLE runs (no Bridge): checks the plumbing only")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_one:
        run = json.loads(args.run_one)
        return fake_run(run, args.result) if args.fake else run_one(run, args.result)
    if args.cases and set(args.cases.split(",")) - set(CASES):
        parser.error(f"--cases {args.cases}: choose from {', '.join(CASES)}")
    if args.dry_run:
        return dry_run()
    if not args.json:
        parser.error("--json PATH is required (where the verdicts go)")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())

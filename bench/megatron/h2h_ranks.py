"""The head-to-head's ranks (bench/megatron/head_to_head.py): `launch` starts WORLD real NCCL peers on
one GPU (gtp.shared_gpu), each running a variant's three implementations or one checkpoint phase,
and collects what each rank reported; a rank that hangs is killed at the deadline and what it wrote
after each finished implementation (its partial file) is kept."""
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import h2h_compare  # noqa: E402
import h2h_plan  # noqa: E402


def _error(error, stage):
    return {"error": f"{stage}: {type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def run_impl(variant, world, impl, steps, reference):
    """One implementation of a variant on this rank: built (initial rows from GTP off's `reference`),
    trained `steps` steps. Returns losses, norms, NCCL ops per step, parameters, checks; or an error
    ({"error", "refused", "in_training"})."""
    import torch
    import h2h_model as hm
    start = time.time()
    try:
        hm.init_parallel(h2h_plan.layout(variant, world, impl))
        model, optimizer, config, checks, initial = hm.build(variant, world, impl, seed=1234, reference=reference)
    except hm.Refused as refusal:
        return {"error": str(refusal), "refused": True, "traceback": traceback.format_exc()}
    except Exception as error:  # noqa: BLE001 - reported; the ranks are still in step (before training)
        return {**_error(error, "build"), "in_training": False}
    try:
        weights = sum(bool(getattr(p, "is_gtp_weight_remat", False)) for m in model for p in m.parameters())
        losses, norms, ops = hm.train(model, optimizer, config, variant, world, steps)
        result = {"losses": losses, "loss_hex": [x.hex() for x in losses], "grad_norms": norms, "ops": ops,
                  "params": hm.snapshot(model), "initial": initial, "checks": checks, "gtp_weights": weights}
        hm.release(model, optimizer, config)
    except Exception as error:  # noqa: BLE001 - reported; the peers may be stuck in a collective
        return {**_error(error, "training"), "in_training": True}
    result["seconds"] = time.time() - start
    torch.cuda.empty_cache()
    return result


def _public(run):
    """What of a run goes to the JSON (no tensors)."""
    return {k: v for k, v in run.items() if k not in ("params", "initial", "ops")}


def _write_partial(path, payload):
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def variant_rank(rank, world, name, steps, partial):
    """A variant's three implementations on this rank, then its verdict and NCCL counts."""
    variant = h2h_plan.VARIANTS[name]
    runs, reference = {}, None
    for impl in h2h_plan.IMPLS:
        if impl != "off" and reference is None:
            runs[impl] = {"error": "not run: GTP off failed", "in_training": False}
            continue
        runs[impl] = run_impl(variant, world, impl, steps, reference)
        if impl == "off" and "error" not in runs["off"]:
            reference = runs["off"]["initial"]
        _write_partial(partial, {"rank": rank, "runs": {k: _public(v) for k, v in runs.items()}})
        if runs[impl].get("in_training"):
            break  # the communicators may be in any state now: the launcher's deadline ends the peers
    last = list(runs)[-1]
    for impl in h2h_plan.IMPLS:
        if impl not in runs:
            runs[impl] = {"error": f"not run: {last} failed during training ({runs[last]['error']})"}
    summary = {"rank": rank, **h2h_compare.verdict(runs["libgtp"], runs["megatron"], runs["off"])}
    sizes = (h2h_plan.gtp_size(variant, world), variant.expert_gtp)
    summary["nccl_per_step"], summary["gathers"] = {}, {}
    for impl, run in runs.items():
        if "ops" in run and run["ops"]:
            table = h2h_compare.op_table(run["ops"])
            summary["nccl_per_step"][impl] = table
            if impl != "off":
                summary["gathers"][impl] = h2h_compare.gathers_per_weight(table, sizes, run["gtp_weights"])
    g = summary["gathers"]
    if all(g.get(i, {}).get("allgathers_per_step") for i in ("libgtp", "megatron")):
        g["libgtp_over_megatron"] = g["libgtp"]["allgathers_per_step"] / g["megatron"]["allgathers_per_step"]
    summary["runs"] = {k: _public(v) for k, v in runs.items()}
    return summary


def ckpt_rank(rank, world, phase, folder, partial):
    """One checkpoint phase on this rank (h2h_plan.checkpoint_plan)."""
    import h2h_model as hm
    variant = h2h_plan.VARIANTS[h2h_plan.CKPT_VARIANT]
    path = os.path.join(folder, phase["ckpt"])
    if phase["role"] == "save":
        impl = phase["impl"]
        hm.init_parallel(h2h_plan.layout(variant, world, impl))
        model, optimizer, config, _, _ = hm.build(variant, world, impl, seed=1234)
        before, _, _ = hm.train(model, optimizer, config, variant, world, h2h_plan.CKPT_TRAIN)
        hm.save(model, optimizer, path)
        after, norms, _ = hm.train(model, optimizer, config, variant, world, h2h_plan.CKPT_CONTINUE,
                                   first_step=h2h_plan.CKPT_TRAIN)
        hm.release(model, optimizer, config)
        return {"rank": rank, "saved_by": impl, "losses_before_save": before, "losses_after_save": after,
                "grad_norms_after_save": norms}
    runs, loaded = {}, {}
    for impl in phase["impls"]:
        try:
            hm.init_parallel(h2h_plan.layout(variant, world, impl))
            model, optimizer, config, _, _ = hm.build(variant, world, impl, seed=999)  # other weights until loaded
            hm.load(model, optimizer, path)
            loaded[impl] = hm.snapshot(model)
            losses, norms, _ = hm.train(model, optimizer, config, variant, world, h2h_plan.CKPT_CONTINUE,
                                        first_step=h2h_plan.CKPT_TRAIN)
            runs[impl] = {"losses": losses, "loss_hex": [x.hex() for x in losses], "grad_norms": norms,
                          "params": hm.snapshot(model)}
            hm.release(model, optimizer, config)
        except hm.Refused as refusal:
            runs[impl] = {"error": str(refusal), "refused": True}
        except Exception as error:  # noqa: BLE001 - reported; the next load may still run
            runs[impl] = _error(error, "load or continue")
        _write_partial(partial, {"rank": rank, "runs": {k: _public(v) for k, v in runs.items()}})
    summary = {"rank": rank, **h2h_compare.verdict(runs["libgtp"], runs["megatron"], runs["off"])}
    if "off" in loaded:
        summary["loaded_equal_to_off"] = h2h_compare.loaded_equal(loaded)
    summary["runs"] = {k: _public(v) for k, v in runs.items()}
    return summary


def _entry(rank, world, store_dir, launch_id, log_dir, queue, job):
    from gtp import shared_gpu
    shared_gpu.apply(rank, launch_id)
    if log_dir:
        log = os.path.join(log_dir, f"nccl_rank{rank}.log")
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL", NCCL_DEBUG_FILE=log, GTP_H2H_NCCL_LOG=log)
    os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    partial = os.path.join(store_dir, f"partial_rank{rank}.json")
    try:
        import torch
        torch.cuda.set_device(0)
        store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
        torch.distributed.init_process_group("nccl", store=store, rank=rank, world_size=world)
        if job["kind"] == "variant":
            result = variant_rank(rank, world, job["name"], job["steps"], partial)
        else:
            result = ckpt_rank(rank, world, job["phase"], job["folder"], partial)
    except BaseException:  # noqa: BLE001 - reported to the launcher
        queue.put((rank, False, traceback.format_exc()))
        return
    queue.put((rank, True, result))
    torch.distributed.barrier()  # no rank leaves while a peer may still be in a collective with it
    torch.distributed.destroy_process_group()


def launch(world, job, deadline_s, nccl_log=True):
    """Runs `job` on `world` peers sharing GPU 0; returns (per-rank results, failures). A rank that
    has not reported by the deadline is killed; its partial file (if any) is its result."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    got, failures = {}, []
    with tempfile.TemporaryDirectory() as store_dir:
        procs = [context.Process(target=_entry, args=(r, world, store_dir, str(os.getpid()),
                                                      store_dir if nccl_log else None, queue, job))
                 for r in range(world)]
        for p in procs:
            p.start()
        end = time.time() + deadline_s
        while len(got) < world and time.time() < end:
            try:
                rank, ok, value = queue.get(timeout=max(1.0, min(10.0, end - time.time())))
            except Exception:  # noqa: BLE001 - queue.Empty: look at the processes
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
                continue
            got[rank] = value if ok else None
            if not ok:
                failures.append(f"rank {rank}: {value.strip().splitlines()[-1]}")
                print(f"rank {rank} failed:\n{value}", file=sys.stderr, flush=True)
        for r, p in enumerate(procs):
            if r not in got:
                failures.append(f"rank {r}: no report after {deadline_s:.0f} s (killed)" if p.is_alive()
                                else f"rank {r}: exited {p.exitcode} without a report")
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for r in range(world):
            if got.get(r) is None:
                partial = os.path.join(store_dir, f"partial_rank{r}.json")
                got[r] = json.load(open(partial)) if os.path.exists(partial) else {"rank": r}
                got[r]["verdict"] = "failed: " + "; ".join(f for f in failures if f.startswith(f"rank {r}:"))
    return [got[r] for r in range(world)], failures

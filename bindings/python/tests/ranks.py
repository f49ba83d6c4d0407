"""Runs a function on N ranks as N spawned processes sharing a store folder (no launcher needed)."""
import contextlib
import itertools
import multiprocessing
import os
import pickle
import sys
import tempfile
import traceback


_launches = itertools.count()
RANK_THREADS = 1  # torch threads per rank: the same CPU GEMM path on every run, and fair on a shared machine


@contextlib.contextmanager
def rank_threads():
    """Runs the block with the ranks' torch thread count, so a reference computed in the test process
    takes the GEMM path the ranks took: CPU GEMMs split their sums by thread count, so a different
    count rounds differently (seen with torch 2.15's oneDNN) and only then would results differ."""
    import torch
    saved = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _entry(fn, rank, world_size, store_dir, args, results, share_gpu):
    if share_gpu:  # real NCCL peers on one GPU: before anything in this process initialises NCCL
        from gtp import shared_gpu
        shared_gpu.apply(rank, share_gpu)
    torch = sys.modules.get("torch")  # imported by fn's module, if it uses torch at all
    if torch is not None:
        torch.set_num_threads(RANK_THREADS)
    try:
        # Plain pickle bytes: a queue would pass tensors by shared memory that dies with this process.
        results.put((rank, True, pickle.dumps(fn(rank, world_size, store_dir, *args))))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world_size, *args, timeout_s=240, share_gpu=False):
    """fn(rank, world_size, store_dir, *args) on every rank; returns the results by rank, or raises
    with every failing rank's traceback. fn must be importable (a module-level function). share_gpu:
    the ranks are real NCCL peers on the one GPU (gtp.shared_gpu; correctness only)."""
    launch_id = f"{os.getpid()}-{next(_launches)}" if share_gpu else None
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        processes = [context.Process(target=_entry, args=(fn, r, world_size, store_dir, args, results, launch_id))
                     for r in range(world_size)]
        for p in processes:
            p.start()
        collected = {}
        try:
            for _ in range(world_size):
                rank, ok, value = results.get(timeout=timeout_s)
                collected[rank] = (ok, value)
        finally:
            for p in processes:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(collected.items()) if not ok]
    if failures or len(collected) != world_size:
        missing = sorted(set(range(world_size)) - set(collected))
        raise AssertionError("\n".join(failures) + (f"\nranks {missing} reported nothing" if missing else ""))
    return [pickle.loads(collected[r][1]) for r in range(world_size)]


def store_path(store_dir):
    return os.path.join(store_dir, "store")

#!/usr/bin/env python3
"""The PyTorch FSDP2 peer of `gtp-bench all_gather`: the same BF16 weights, all-gathered by
`torch.distributed.fsdp.fully_shard`'s own unshard (copy-in, all_gather_into_tensor, copy-out).

For each size S (-b/-e/-f as gtp-bench) one module holds one BF16 parameter [S / (2*4096), 4096],
its rows split evenly over the N ranks (per-rank rows rounded down like gtp-bench's per-rank count),
sharded with fully_shard over a 1-D device mesh of all ranks. One iteration = `module.unshard()`
(returns once the gathered parameter is usable on the current stream), timed alone; `reshard()`
follows, untimed. Times: median of -n iterations after -w warm-ups per rank (CUDA events on GPU,
the steady clock on CPU), averaged over ranks; algbw = size / time, busbw = algbw * (n-1)/n in GB/s
of 1e9 bytes, as gtp-bench. A checked unshard first (every rank's shard filled with rank + 1) counts
gathered elements that are not their owner's value (`wrong`, summed over ranks; non-zero exits 1).

N processes are spawned here (torch.multiprocessing, env:// rendezvous on 127.0.0.1; no torchrun).
GPU: NCCL, one GPU per rank, NCCL_NVLS_ENABLE=0 unless set. CPU (--device cpu): gloo, a smoke test.
usage: fsdp2_allgather_peer.py [-N RANKS] [-b 1M] [-e 4G] [-f 2] [-n 20] [-w 5] [--device cuda|cpu]
                               [--json FILE]
"""
import argparse
import json
import os
import random
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLS = 4096  # gtp-bench --format's weight width
ELEMENT_BYTES = 2  # BF16


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: give bytes, optionally with K, M or G (e.g. 64M)")
    return int(digits) * scale


def sweep(min_bytes, max_bytes, factor, ranks):
    """(size, rows, rows per rank) per point: the gathered BF16 weight, at least one row per rank."""
    points, requested = [], min_bytes
    while requested <= max_bytes:
        per_rank_rows = max(requested // (ELEMENT_BYTES * COLS * ranks), 1)
        rows = per_rank_rows * ranks
        points.append((rows * COLS * ELEMENT_BYTES, rows, per_rank_rows))
        requested *= factor
    return points


def bus_bandwidth_factor(ranks):
    return (ranks - 1) / ranks


class Weight(torch.nn.Module):
    def __init__(self, rows, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(rows, COLS, dtype=torch.bfloat16, device=device))


def time_unshards(module, iters, device):
    """Per-iteration seconds of module.unshard() as the current stream (GPU) or the host (CPU) sees it."""
    if device.type == "cuda":
        pairs = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            module.unshard()
            end.record()
            module.reshard()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]
    seconds = []
    for _ in range(iters):
        start = time.perf_counter()
        module.unshard()
        seconds.append(time.perf_counter() - start)
        module.reshard()
    return seconds


def rank_main(rank, ranks, port, args, queue):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks),
                      LOCAL_RANK=str(rank))
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", device_id=device if cuda else None)
    mesh = init_device_mesh(device.type, (ranks,))
    results = []
    for size, rows, per_rank_rows in sweep(args.b, args.e, args.f, ranks):
        module = Weight(rows, device)
        fully_shard(module, mesh=mesh)
        local = module.weight.to_local()
        with torch.no_grad():
            local.fill_(rank + 1)  # small integers: exact in BF16
        module.unshard()
        owner = torch.arange(rows, device=device).div(per_rank_rows, rounding_mode="floor").add(1)
        wrong = (module.weight.detach() != owner.to(torch.bfloat16).unsqueeze(1)).sum()
        module.reshard()
        time_unshards(module, args.w, device)
        median = torch.tensor(statistics.median(time_unshards(module, args.n, device)), dtype=torch.float64,
                              device=device)
        dist.all_reduce(wrong)
        dist.all_reduce(median)
        time_us = median.item() / ranks * 1e6
        algbw = size / 1e3 / time_us
        results.append({"size": size, "count": size // ELEMENT_BYTES, "type": "bfloat16", "redop": "none",
                        "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_bandwidth_factor(ranks),
                        "wrong": int(wrong.item()), "path": "fsdp2", "shape": [rows, COLS],
                        "shard_shape": list(local.shape)})
        del module, local
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        queue.put(results)
    # Every rank past its last collective, then out without tearing gloo down: with torch 2.15 a rank
    # destroying its group while a peer's gloo work thread still ran aborted ("terminate called without
    # an active exception") about once in six runs, and once more in 2 x 89 parallel test runs with a
    # barrier before the destroy. The results are already in the queue and nothing after this is
    # measured, so the ranks skip the teardown (os._exit: no destructors run).
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    """A free loopback port outside the kernel's ephemeral range where there is room (as gtp-launch picks
    its root port, docs/comm.md): one inside it can be taken by another socket before the store listens."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 1024, 65535
    below, above = (1024, low - 1), (high + 1, 65535)
    first, last = max(below, above, key=lambda r: r[1] - r[0])
    candidates = [random.randint(first, last) for _ in range(64)] if last > first else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free loopback TCP port to rendezvous on")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-N", "--ranks", type=int, default=None, help="processes (default: visible GPUs)")
    parser.add_argument("-b", type=parse_size, default=parse_size("1M"), help="minimum size S (gathered bytes)")
    parser.add_argument("-e", type=parse_size, default=parse_size("4G"), help="maximum size S")
    parser.add_argument("-f", type=int, default=2, help="multiplication factor between sizes")
    parser.add_argument("-n", type=int, default=20, help="timed iterations per size")
    parser.add_argument("-w", type=int, default=5, help="warm-up iterations per size")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if a GPU is seen")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ranks = args.ranks or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if ranks < 2:
        parser.error(f"-N {ranks}: an all-gather needs at least 2 ranks (on GPU: 2 visible GPUs)")
    if args.device == "cuda" and ranks > torch.cuda.device_count():
        parser.error(f"-N {ranks} exceeds the {torch.cuda.device_count()} visible GPU(s); one GPU per rank")
    if args.f < 2 or args.n < 1 or args.w < 0 or args.b > args.e:
        parser.error(f"-f {args.f} -n {args.n} -w {args.w} -b {args.b} -e {args.e}: "
                     "need f >= 2, n >= 1, w >= 0, b <= e")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (the lent machines' rule)

    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(ranks, free_port(), args, queue), nprocs=ranks, join=True)
    results = queue.get()
    backend = "NCCL " + ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else "gloo"
    doc = {
        "tool": "fsdp2_allgather_peer", "command": " ".join(sys.argv),
        "commit": os.environ.get("GTP_COMMIT", "unknown"),
        "machine": {"hostname": socket.gethostname(),
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None},
        "torch": torch.__version__, "path": "gpu" if args.device == "cuda" else "host",
        "transport": f"torch.distributed {backend}, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}",
        "collective": "all_gather", "implementation": "torch.distributed.fsdp.fully_shard unshard()",
        "ranks": ranks, "group": "world", "group_size": ranks, "format": "bf16", "iters": args.n, "warmup": args.w,
        "busbw_factor": bus_bandwidth_factor(ranks),
        "timing": ("median over iterations of one unshard() per rank (CUDA events on the current stream, or the "
                   "steady clock on CPU), averaged over ranks"),
        "results": results,
    }
    print(f"# FSDP2 all_gather (fully_shard unshard), {ranks} ranks, {doc['transport']}")
    print(f"# {'size(B)':>12} {'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")
    for r in results:
        print(f"  {r['size']:>12} {r['time_us']:>10.1f} {r['algbw_gbps']:>11.2f} {r['busbw_gbps']:>11.2f}"
              f" {r['wrong']:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 1 if any(r["wrong"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

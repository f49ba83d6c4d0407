"""Ranks that fail, from Python: a rank failing inside a call fails its peers at once, the per-call
timeout and the watchdog poll (Context.check), INT64_MAX timeouts (docs/reliability.md)."""
import time

import numpy as np
import pytest

import gtp
from ranks import run_ranks, store_path

INT64_MAX = 2**63 - 1
ROWS, COLS = 64, 128


def one_rank(tmp_path, **kwargs):
    return gtp.Context(gtp.FileStore(str(tmp_path / "store")), 0, 1, **kwargs)


@pytest.mark.parametrize("value, message", [
    (float("inf"), "call_timeout_s=inf is outside"),
    (0, "call_timeout_s=0 is outside"),
    (1e-6, "call_timeout_s=1e-06 is outside"),
])
def test_call_timeout_out_of_range_is_refused(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        one_rank(tmp_path, call_timeout_s=value)


def test_check_passes_on_a_healthy_context_and_names_the_reason_after_abort(tmp_path):
    with one_rank(tmp_path, call_timeout_s=5) as ctx:
        ctx.check()
        ctx.abort()
        with pytest.raises(gtp.InvalidStateError, match="aborted"):
            ctx.check()


def _shard(rank, world):
    return np.full((ROWS // world, COLS), float(rank + 1), np.float32)


def _failing_rank(rank, world, store_dir):
    # Every rank's budget has room for one gathered weight (16 KiB), not two. The last rank still holds
    # w0 when the ranks materialize w1: its materialize fails inside the call. It comes 0.5 s late, so
    # that its abort finds rank 0 waiting in w1's gather (not finishing w0's).
    store = gtp.FileStore(store_path(store_dir), timeout_s=60)
    with gtp.Context(store, rank, world, timeout_s=60, call_timeout_s=60, prefetch_depth=0,
                     memory_budget_bytes=24 * 1024) as ctx:
        w0 = ctx.register("w0", _shard(rank, world), ROWS, COLS, dtype="fp32")
        w1 = ctx.register("w1", _shard(rank, world), ROWS, COLS, dtype="fp32")
        ctx.shard_updated([w0, w1])
        ctx.materialize([w0])
        if rank == world - 1:
            time.sleep(0.5)
        else:
            ctx.release([w0])
        start = time.monotonic()
        try:
            ctx.materialize([w1])
        except gtp.GtpError as e:
            return type(e).__name__, str(e), time.monotonic() - start
        return "success", "", time.monotonic() - start


def test_a_rank_failing_inside_a_call_fails_its_peers_at_once_naming_it():
    results = run_ranks(_failing_rank, 2)
    assert results[1][0] == "SystemError" and "memory budget" in results[1][1], results
    kind, message, seconds = results[0]
    assert kind != "success", results
    assert seconds < 15, f"rank 0 waited {seconds:.1f} s (its call timeout is 60 s)"
    for name in ("gtp_materialize", "rank 1", "gtp_remat", "memory budget"):
        assert name in message, (name, message)


def _int64_max(rank, world, store_dir):
    store = gtp.FileStore(store_path(store_dir))
    with gtp.Context(store, rank, world, timeout_s=INT64_MAX / 1000, call_timeout_s=INT64_MAX / 1000) as ctx:
        w = ctx.register("w", _shard(rank, world), ROWS, COLS, dtype="fp32")
        ctx.shard_updated([w])
        [a] = ctx.materialize_arrays([w])
        first = int(a[0, 0])  # BF16 bits
        ctx.release([w])
        ctx.check()
        return first


def test_int64_max_timeouts_mean_very_long_not_at_once():
    assert run_ranks(_int64_max, 2) == [0x3F80, 0x3F80]  # 1.0, rank 0's row 0, on both ranks


def _silent_peer(rank, world, store_dir):
    # Rank 1 stops calling after shard_updated; rank 0's materialize at depth 1 waits on it. Its data
    # send to rank 1 is never taken, and the ABORT rank 0 then posts to rank 1 queues behind it.
    store = gtp.FileStore(store_path(store_dir), timeout_s=60)
    ctx = gtp.Context(store, rank, world, timeout_s=60, call_timeout_s=2, prefetch_depth=1)
    rows = ctx.geometry(16, 16).valid_rows  # small: each gather's send is one eager message
    ws = [ctx.register(f"w{i}", np.ones((rows, 16), np.float32), 16, 16) for i in range(3)]
    ctx.shard_updated(ws)
    outcome = None
    if rank == 0:
        start = time.monotonic()
        try:
            ctx.materialize([ws[0]])
            ctx.release([ws[0]])
            ctx.materialize([ws[1]])
            outcome = ("success", "", time.monotonic() - start)
        except gtp.GtpError as e:
            outcome = (type(e).__name__, str(e), time.monotonic() - start)
    else:
        time.sleep(5)
    try:
        ctx.close()
    except gtp.GtpError:
        pass  # rank 1 finds the job failed: either way destroy frees it
    return outcome


def test_a_call_timeout_fires_at_the_timeout_it_names():
    kind, message, seconds = run_ranks(_silent_peer, 2)[0]
    assert kind == "TimeoutError" and "timed out after 2 s" in message, (kind, message)
    # It used to come 1 s late: the ABORT to the silent peer, queued behind the data send it never
    # took, was waited for (min(timeout, 1 s)) before the error was raised.
    assert 2 <= seconds < 2.8, f"{seconds:.2f} s for a 2 s call timeout"

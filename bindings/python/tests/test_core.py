"""gtp (ctypes + numpy, no framework) over the host backend, 1, 2 and 4 processes."""
import os
import sys

import numpy as np
import pytest

import gtp
from gtp.context import host_array
from ranks import run_ranks, store_path

ROWS, COLS = 40, 64  # G = 4: shard_rows 16, rank 3 holds only padding


def full_weight(rows=ROWS, cols=COLS, seed=7):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _round_trip(rank, world, store_dir, wire):
    store = gtp.FileStore(store_path(store_dir))
    with gtp.Context(store, rank, world) as ctx:
        full = full_weight()
        g = ctx.geometry(ROWS, COLS, wire)
        w = ctx.register("w", full[g.row_start:g.row_start + g.valid_rows].copy(), ROWS, COLS, wire=wire)
        ctx.shard_updated([w])
        out = []
        for phase in ("forward", "backward"):
            [a] = ctx.materialize_arrays([w], phase)
            out.append(a.copy())
            ctx.release([w])
        ctx.drain()
        return g.valid_rows, out


def test_bf16_conversion_rounds_to_nearest_even_and_canonicalizes_nan():
    from gtp.context import float32_to_bf16_bits
    values = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -2.5, np.inf, -np.inf], dtype=np.float32)
    nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], dtype=np.uint32).view(np.float32)
    got = float32_to_bf16_bits(np.concatenate([values, nans]))
    # Ties go to even: 1 + 2^-8 down to 1.0, 1 + 3 * 2^-8 up to 1 + 2^-6.
    assert got.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80, 0xFF80, 0x7FFF, 0x7FFF, 0x7FFF]


@pytest.mark.parametrize("world", [2, 4])
def test_bf16_round_trip_is_bit_exact(world):
    results = run_ranks(_round_trip, world, "bf16")
    expected = gtp.float32_to_bf16_bits(full_weight())
    for valid_rows, arrays in results:
        for a in arrays:
            np.testing.assert_array_equal(a, expected)
    assert sum(v for v, _ in results) == ROWS
    if world == 4:
        assert results[3][0] == 0  # a rank holding only padding still takes part


# Max error relative to the tensor's amax that each wire format may add (docs/formats.md: E4M3 keeps
# 3 mantissa bits; NVFP4's E2M1 steps are 0.5 at most between 4 and 6, scaled per 16-element block).
WIRE_BOUNDS = {"fp8": 2.0 ** -4, "mxfp8": 2.0 ** -4, "nvfp4": 1.0 / 6.0 + 2.0 ** -4}


@pytest.mark.parametrize("wire", sorted(WIRE_BOUNDS))
def test_quantized_wires_are_identical_on_every_rank_and_within_bounds(wire):
    results = run_ranks(_round_trip, 2, wire)
    full = full_weight()
    first = results[0][1][0]
    for _, arrays in results:
        for a in arrays:
            np.testing.assert_array_equal(a, first)
    error = np.abs(gtp.bf16_bits_to_float32(first) - full)
    assert error.max() <= WIRE_BOUNDS[wire] * np.abs(full).max(), (wire, error.max())
    assert error.max() > 0  # it did quantize


def _gradients(rank, world, store_dir):
    store = gtp.FileStore(store_path(store_dir))
    ready = []
    with gtp.Context(store, rank, world, grad_ready=ready.append, trace_spans=256) as ctx:
        g = ctx.geometry(ROWS, COLS)
        shard = full_weight()[g.row_start:g.row_start + g.valid_rows].copy()
        main_grad = np.zeros_like(shard)
        w = ctx.register("w", shard, ROWS, COLS, main_grad=main_grad)
        ctx.shard_updated([w])
        contribution = np.random.default_rng(100 + rank).standard_normal((ROWS, COLS)).astype(np.float32)
        ctx.grad_buffer_array(w)[:] += contribution
        ctx.finalize([w])
        ctx.drain()
        return g, main_grad.copy(), contribution, [r.name for r in ready], ctx.stats(), ctx.trace()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_gradients_are_the_ring_mean_bit_exact(world):
    results = run_ranks(_gradients, world)
    shard_rows = results[0][0].shard_rows
    padded = np.zeros((shard_rows * world, COLS), np.float32)
    contributions = []
    for _, _, c, _, _, _ in results:
        p = padded.copy()
        p[:ROWS] = c
        contributions.append(p)
    mean = gtp.ring_mean(contributions, shard_rows)
    for g, main_grad, _, ready, stats, trace in results:
        np.testing.assert_array_equal(main_grad, mean[g.row_start:g.row_start + g.valid_rows])
        assert ready == ["w"]
        assert stats["grads"]["reduce_scatters"] == 1 and stats["grads"]["grads_ready"] == 1
        assert trace["traceEvents"], "the trace recorded spans"


def _uninitialized_gradients(rank, world, store_dir):
    """Two steps of grad_buffer_ex without the zero-fill: each step's first call must be written (its buffer is
    the previous step's, reused), a second call in the step is added to; the padding rows read zero. On one
    rank the buffer is the main grad itself (the reduce-scatter is the identity): added to from the start."""
    store = gtp.FileStore(store_path(store_dir))
    with gtp.Context(store, rank, world) as ctx:
        g = ctx.geometry(ROWS, COLS)
        shard = full_weight()[g.row_start:g.row_start + g.valid_rows].copy()
        main_grad = np.zeros_like(shard)
        w = ctx.register("w", shard, ROWS, COLS, main_grad=main_grad)
        ctx.shard_updated([w])
        rng = np.random.default_rng(200 + rank)
        steps = []
        for _ in range(2):
            first = ctx.grad_buffer_ex(w)
            written, added = (rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(2))
            if world == 1:
                assert first.address == main_grad.ctypes.data and not first.overwrite
                padded = main_grad
                padded += written
            else:
                assert first.overwrite
                padded = gtp.host_array(first.address, (g.shard_rows * world, COLS), np.float32)
                assert not padded[ROWS:].any(), "padding rows must be zero"
                padded[:ROWS] = written
            again = ctx.grad_buffer_ex(w)
            assert again.address == first.address and not again.overwrite
            padded[:ROWS] += added
            ctx.finalize([w])
            ctx.drain()
            steps.append((main_grad.copy(), written + added))
            main_grad[:] = 0
        zeroed = ctx.grad_buffer_ex(w, uninitialized=False)
        assert not zeroed.overwrite and not gtp.host_array(zeroed.address, (ROWS, COLS), np.float32).any()
        ctx.finalize([w])
        ctx.drain()
        return g, steps


@pytest.mark.parametrize("world", [1, 4])
def test_uninitialized_grad_buffers_are_written_then_added_and_reduce_exactly(world):
    results = run_ranks(_uninitialized_gradients, world)
    shard_rows = results[0][0].shard_rows
    for step in range(2):
        contributions = []
        for _, steps in results:
            p = np.zeros((shard_rows * world, COLS), np.float32)
            p[:ROWS] = steps[step][1]
            contributions.append(p)
        mean = gtp.ring_mean(contributions, shard_rows)
        for g, steps in results:
            np.testing.assert_array_equal(steps[step][0], mean[g.row_start:g.row_start + g.valid_rows])


def test_one_rank_grad_buffer_is_the_main_grad_unless_asked_separate(tmp_path):
    with gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1) as ctx:
        main_grad = np.zeros((ROWS, COLS), np.float32)
        w = ctx.register("w", full_weight(), ROWS, COLS, main_grad=main_grad)
        with pytest.raises(ValueError, match="separate=True needs uninitialized=True"):
            ctx.grad_buffer_ex(w, uninitialized=False, separate=True)
        separate = ctx.grad_buffer_ex(w, separate=True)
        assert separate.overwrite and separate.address != main_grad.ctypes.data
        gtp.host_array(separate.address, (ROWS, COLS), np.float32)[:] = 2.0
        ctx.finalize([w])
        direct = ctx.grad_buffer_ex(w)
        assert not direct.overwrite and direct.address == main_grad.ctypes.data
        main_grad += 1.0  # the consumer's add, after the pending add of the separate buffer was applied
        ctx.finalize([w])
        ctx.drain()
        assert (main_grad == 3.0).all()
        stats = ctx.stats()["grads"]
        assert stats["reduce_scatters"] == 1 and stats["into_main_grad"] == 1


def test_library_is_found_and_header_version_is_checked(tmp_path):
    assert os.path.isfile(gtp.library_path())
    with pytest.raises(gtp.VersionError) as e:
        gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1, header_version=10000)
    assert "1.0" in e.value.message and f"{gtp.VERSION_MAJOR}.{gtp.VERSION_MINOR}" in e.value.message
    assert e.value.status_name == "GTP_ERROR_VERSION"


def test_misuse_raises_the_status_class_with_the_library_message(tmp_path):
    ctx = gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1)
    with pytest.raises(gtp.InvalidArgumentError, match="cols=20"):
        ctx.register("odd", np.zeros((16, 20), np.float32), 16, 20)
    with pytest.raises(ValueError, match=r"rows \[0, 40\)"):
        ctx.register("short", np.zeros((8, COLS), np.float32), ROWS, COLS)
    w = ctx.register("w", full_weight(), ROWS, COLS)
    with pytest.raises(gtp.InvalidStateError, match="not materialized"):
        ctx.release([w])
    with pytest.raises(gtp.InvalidArgumentError, match="n is 0"):
        ctx.materialize([])
    with pytest.raises(gtp.InvalidArgumentError, match="listed twice"):
        ctx.shard_updated([w, w])
    with pytest.raises(gtp.InvalidArgumentError, match="main_grad"):
        ctx.grad_buffer(w)
    with pytest.raises(gtp.InvalidArgumentError, match="main_grad"):
        ctx.grad_buffer_ex(w)
    with pytest.raises(ValueError, match="phase='sideways'"):
        ctx.materialize([w], "sideways")
    ctx.unregister(w)
    with pytest.raises(gtp.InvalidStateError, match="not registered"):
        ctx.shard_updated([w])
    ctx.abort()
    with pytest.raises(gtp.InvalidStateError, match="aborted"):
        ctx.stats()
    ctx.close()
    ctx.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        ctx.stats()


def test_weight_amax_is_the_finite_amax_of_the_latest_update(tmp_path):
    """Context.weight_amax (gtp_weight_amax) on one rank: libgtp's amax slot after each shard_updated
    (the G = 2 case: tests/test_te_recipes.py and //bindings/c:gtp_amax_test), and its refusals."""
    with gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1) as ctx:
        shard = full_weight()
        shard[3, 4], shard[5, 6], shard[7, 8] = -11.5, np.inf, np.nan
        w = ctx.register("w", shard, ROWS, COLS, wire="fp8")
        with pytest.raises(gtp.InvalidStateError, match="weight 'w' has no amax yet"):
            ctx.weight_amax(w)
        ctx.shard_updated([w])
        assert host_array(ctx.weight_amax(w), (1,), np.float32)[0] == np.float32(11.5)
        shard[3, 4] = 2.0  # registered by address: libgtp reads it at the next update
        ctx.shard_updated([w])
        assert host_array(ctx.weight_amax(w), (1,), np.float32)[0] == np.abs(np.nan_to_num(shard, posinf=0)).max()
        b = ctx.register("b", full_weight(), ROWS, COLS)
        ctx.shard_updated([b])
        with pytest.raises(gtp.InvalidArgumentError, match="weight 'b' travels on the bf16 wire"):
            ctx.weight_amax(b)


def test_cuda_backend_without_a_device_is_a_cuda_error(tmp_path):
    with pytest.raises(gtp.CudaError) as e:
        gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1, backend="cuda")
    assert "GTP_ERROR_CUDA" in str(e.value) and e.value.message


def test_grad_ready_callback_is_refused_on_the_cuda_backend(tmp_path):
    # libgtp would call it on CUDA's host-function thread; refused before anything is created.
    with pytest.raises(ValueError, match="host-function thread"):
        gtp.Context(gtp.FileStore(str(tmp_path)), 0, 1, backend="cuda", grad_ready=print)


def test_missing_peer_is_a_timeout(tmp_path):
    with pytest.raises(gtp.TimeoutError) as e:
        gtp.Context(gtp.FileStore(str(tmp_path), timeout_s=1), 0, 2, timeout_s=1)
    assert "did not appear" in e.value.message


class BrokenStore:
    def set(self, key, value):
        raise ConnectionError("store server went away")

    def get(self, key):
        raise ConnectionError("store server went away")


def test_store_failure_is_a_system_error_with_the_store_message():
    with pytest.raises(gtp.SystemError, match="store server went away"):
        gtp.Context(BrokenStore(), 0, 2, timeout_s=5)


def test_library_discovery_honours_gtp_library_first():
    import subprocess
    env = dict(os.environ, GTP_LIBRARY="/nonexistent/libgtp.so")
    code = "import gtp; gtp.library_path()"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    assert run.returncode != 0 and "/nonexistent/libgtp.so (GTP_LIBRARY)" in run.stderr, run.stderr


@pytest.mark.skipif(not os.environ.get("GTP_LAUNCH"), reason="GTP_LAUNCH (the gtp-launch binary) is not set")
@pytest.mark.parametrize("world", [2, 3])
def test_ucx_bootstrap_under_gtp_launch(world):
    import subprocess
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_worker.py")
    run = subprocess.run([os.environ["GTP_LAUNCH"], "-n", str(world), "--timeout", "120", "--", sys.executable, worker],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("round trip exact") == world, run.stdout

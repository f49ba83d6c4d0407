"""Hostile input from Python: integers ctypes would truncate, the profile's group wire, raising raw
bootstrap callbacks and a monitoring thread reading stats (docs/reliability.md)."""
import ctypes
import json
import threading

import numpy as np
import pytest

import gtp
from gtp import _lib


def one_rank(tmp_path, **kwargs):
    return gtp.Context(gtp.FileStore(str(tmp_path / "store")), 0, 1, **kwargs)


def profile(groups):
    return json.dumps({
        "schema_version": 1,
        "cluster": {"template": {"host_count": 1, "host": {
            "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}], "gpus": [{"index": 0, "numa_node": 0}]}}},
        "parallel": {"world_size": 1, "tensor_parallel_num_weight_shards": 1},
        "groups": groups})


@pytest.mark.parametrize("kwargs, message", [
    ({"prefetch_depth": 2**40}, "prefetch_depth=1099511627776 is outside [0, 64]"),
    ({"prefetch_depth": -1}, "prefetch_depth=-1 is outside [0, 64]"),  # not GTP_FROM_PROFILE in disguise
    ({"memory_budget_bytes": 2**64 + 5}, "memory_budget_bytes=18446744073709551621 is outside"),
    ({"trace_spans": 2**64}, "trace_spans=18446744073709551616 is outside"),
    ({"timeout_s": float("inf")}, "timeout_s=inf is outside"),
    ({"timeout_s": 1e-6}, "timeout_s=1e-06 is outside"),
    ({"timeout_s": float("nan")}, "timeout_s=nan is outside"),
])
def test_context_integers_out_of_range_are_refused_before_ctypes(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        one_rank(tmp_path, **kwargs)


def test_values_libgtp_bounds_are_refused_naming_them(tmp_path):
    with pytest.raises(gtp.InvalidArgumentError, match=r"trace_spans is 4611686018427387904"):
        one_rank(tmp_path, trace_spans=2**62)
    with one_rank(tmp_path) as ctx:
        w = ctx.register("w", np.zeros((16, 16), np.float32), 16, 16)
        ctx.shard_updated([w])
        with pytest.raises(gtp.InvalidArgumentError, match=r"model_chunk is 100000000; give 0..1023"):
            ctx.materialize([w], model_chunk=10**8)
        with pytest.raises(ValueError, match=r"model_chunk=1099511627776 is outside"):
            ctx.materialize([w], model_chunk=2**40)
        with pytest.raises(ValueError, match=r"rows=18446744073709551632 is outside"):
            ctx.register("big", 1, 2**64 + 16, 16, dtype="fp32")  # would have been 16 rows
        with pytest.raises(TypeError, match=r"prefetch_depth=2.5 is not an integer"):
            one_rank(tmp_path, prefetch_depth=2.5)


def test_strings_with_a_nul_are_refused_instead_of_cut(tmp_path):
    text = profile({})
    with pytest.raises(ValueError, match=r"profile_json has a NUL byte at offset \d+"):
        one_rank(tmp_path, profile_json=text + "\0{\"ignored\": 1}")
    with one_rank(tmp_path) as ctx:
        with pytest.raises(ValueError, match=r"name has a NUL byte at offset 2"):
            ctx.register("fc\0hidden", np.zeros((16, 16), np.float32), 16, 16)


@pytest.mark.parametrize("wire", [None, "from_group"])
def test_register_can_take_the_wire_of_the_groups_profile(tmp_path, wire):
    text = profile({"gtp_remat": {"wire_format": "mxfp8", "mx_rounding": "floor"}})
    with one_rank(tmp_path, profile_json=text) as ctx:
        assert ctx.group_wire() == "mxfp8"
        assert ctx.group_wire("expert_gtp_remat") == "bf16"
        assert ctx.geometry(40, 64, wire).padded_rows == 64  # MXFP8 pads rows to 32
        shard = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
        w = ctx.register("w", shard, 40, 64, wire=wire)
        assert (w.wire, w.mx_rounding) == ("mxfp8", "floor")
        ctx.shard_updated([w])
        [view] = ctx.materialize_views([w], layout="gemm")
        assert view.wire == "mxfp8" and view.scales is not None
        ctx.release([w])
        plain = ctx.register("plain", shard, 40, 64)  # the default stays bf16
        assert plain.wire == "bf16"


def create_rank0_of_2_with_raw_callbacks(fns):
    """gtp_context_create straight through ctypes, rank 0 of 2, with the raw callbacks `fns`."""
    vtable = _lib.gtp_bootstrap_callbacks_t(ctypes.sizeof(_lib.gtp_bootstrap_callbacks_t),
                                            _lib.BOOTSTRAP_CALLBACKS_VERSION, 0, 2, None, *fns)
    config = _lib.gtp_context_config_t()
    config.struct_size = ctypes.sizeof(config)
    config.header_version = _lib.HEADER_VERSION
    config.bootstrap = _lib.BOOTSTRAP_CALLBACKS
    config.callbacks = ctypes.pointer(vtable)
    config.timeout_ms = 5000
    config.prefetch_depth = config.memory_budget_bytes = _lib.FROM_PROFILE
    handle = ctypes.c_void_p()
    return _lib.lib().gtp_context_create(ctypes.byref(config), ctypes.byref(handle)), handle


def test_a_raising_raw_bootstrap_callback_is_an_error(tmp_path):
    def raising(*_args):
        raise RuntimeError("the store is gone")

    assert _lib.ALLGATHER_FN(raising)(None, None, None, 0, 0) == _lib.BOOTSTRAP_ERROR
    assert _lib.BROADCAST_FN(raising)(None, None, 0, 0, 0) == _lib.BOOTSTRAP_ERROR
    assert _lib.BARRIER_FN(raising)(None, 0) == _lib.BOOTSTRAP_ERROR
    fns = [_lib.ALLGATHER_FN(raising), _lib.BROADCAST_FN(raising), _lib.BARRIER_FN(raising),
           _lib.LAST_ERROR_FN(lambda _user: None)]
    status, handle = create_rank0_of_2_with_raw_callbacks(fns)
    assert status == _lib.ERROR_SYSTEM, _lib.lib().gtp_last_error(None)
    assert handle.value is None


def test_a_monitoring_thread_reads_stats_while_the_context_works(tmp_path):
    with one_rank(tmp_path, trace_spans=64) as ctx:
        w = ctx.register("w", np.ones((16, 16), np.float32), 16, 16, wire="fp8")
        ctx.shard_updated([w])
        done, errors, reads = threading.Event(), [], []

        def monitor():
            try:
                while not done.is_set():
                    reads.append(ctx.stats()["materialize"]["calls"])
                    ctx.trace()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        thread = threading.Thread(target=monitor)
        thread.start()
        for _ in range(300):
            ctx.materialize([w])
            ctx.release([w])
        done.set()
        thread.join()
        assert not errors, errors
        assert reads and reads == sorted(reads)
        assert ctx.stats()["materialize"]["calls"] == 300


def test_names_and_paths_as_bytes_or_paths_reach_c_unmangled(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(profile({"gtp_remat": {"wire_format": "fp8"}}))
    for given in (path, str(path).encode(), profile({"gtp_remat": {"wire_format": "fp8"}}).encode()):
        kwargs = {"profile_json": given} if isinstance(given, bytes) and given.startswith(b"{") else {
            "profile_path": given}
        with one_rank(tmp_path, **kwargs) as ctx:
            assert ctx.group_wire() == "fp8", given
            w = ctx.register(b"fc1", np.zeros((16, 16), np.float32), 16, 16)
            ctx.shard_updated([w])
            ctx.materialize([w])
            ctx.release([w])
            assert w.name == "fc1" and [x["name"] for x in ctx.stats()["weights"]] == ["fc1"], ctx.stats()
            with pytest.raises(gtp.InvalidArgumentError, match=r"name is not valid UTF-8 \(byte 1 of 2"):
                ctx.register(b"x\xff", np.zeros((16, 16), np.float32), 16, 16)
            with pytest.raises(ValueError, match=r"name='w\\udcff' cannot be encoded as UTF-8 \(character 1"):
                ctx.register("w\udcff", np.zeros((16, 16), np.float32), 16, 16)
            with pytest.raises(TypeError, match=r"name=3 is a int; pass a str or bytes"):
                ctx.register(3, np.zeros((16, 16), np.float32), 16, 16)


def test_a_raising_last_error_callback_is_no_text_not_a_crash():
    def raising(*_args):
        raise RuntimeError("the store is gone")

    assert _lib.LAST_ERROR_FN(raising)(None) is None
    fns = [_lib.ALLGATHER_FN(raising), _lib.BROADCAST_FN(raising), _lib.BARRIER_FN(raising),
           _lib.LAST_ERROR_FN(raising)]
    status, handle = create_rank0_of_2_with_raw_callbacks(fns)
    assert status == _lib.ERROR_SYSTEM, _lib.lib().gtp_last_error(None)
    assert handle.value is None
    assert b"bootstrap callback" in _lib.lib().gtp_last_error(None)


def test_close_refused_inside_grad_ready_keeps_the_context(tmp_path):
    refusals = []

    def ready(_weight):
        try:
            ctx.close()
        except gtp.InvalidStateError as e:
            refusals.append(str(e))
            raise

    ctx = one_rank(tmp_path, grad_ready=ready)
    w = ctx.register("w", np.zeros((16, 16), np.float32), 16, 16, main_grad=np.zeros((16, 16), np.float32))
    ctx.shard_updated([w])
    ctx.grad_buffer_array(w)[:] += 1.0
    ctx.finalize([w])
    with pytest.raises(gtp.InvalidStateError, match="gtp_context_destroy was called from inside gtp_drain"):
        ctx.drain()
    assert len(refusals) == 1 and not ctx.closed
    assert ctx.stats()["grads"]["grads_ready"] == 1  # still usable
    ctx.close()
    assert ctx.closed

"""Finds libgtp.so and declares the C ABI of gtp.h for ctypes. Framework-free (ctypes only)."""
import ctypes
import os
import traceback

# The gtp.h this package was written against; gtp_context_create refuses another major.minor.
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = 0, 7, 1
HEADER_VERSION = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH

# gtp_status_t
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_INVALID_STATE = 2
ERROR_TIMEOUT = 3
ERROR_SYSTEM = 4
ERROR_CUDA = 5
ERROR_VERSION = 6
ERROR_INTERNAL = 7
ERROR_DIVERGED = 8

# prefetch_depth / memory_budget_bytes: each group's own profile setting (its default without a profile)
FROM_PROFILE = -1
MAX_DEPTH = 64  # remat::kMaxDepth

# gtp_bootstrap_kind_t, gtp_backend_t, gtp_dtype_t, gtp_wire_t, gtp_group_t, gtp_phase_t, gtp_layout_t
BOOTSTRAP_CALLBACKS, BOOTSTRAP_UCX_FROM_ENV = 0, 1
BACKEND_HOST, BACKEND_CUDA = 0, 1
DTYPE_BF16, DTYPE_FP32 = 0, 1
WIRE_FROM_GROUP, WIRE_BF16, WIRE_FP8, WIRE_MXFP8, WIRE_NVFP4 = -1, 0, 1, 2, 3
# gtp_mx_rounding_t
MX_ROUNDING_RCEIL, MX_ROUNDING_FLOOR = 0, 1
SCALE_LAYOUT_ROW_MAJOR, SCALE_LAYOUT_BLOCKED_128X4 = 0, 1  # gtp_scale_layout_t, since 0.5
GROUP_GTP_REMAT, GROUP_EXPERT_GTP_REMAT = 0, 1
PHASE_FORWARD, PHASE_BACKWARD, PHASE_RECOMPUTE = 0, 1, 2
LAYOUT_BF16, LAYOUT_GEMM = 0, 1
# gtp_elem_t: element types of a materialized section
ELEM_NONE, ELEM_BF16, ELEM_E4M3, ELEM_E2M1, ELEM_E8M0, ELEM_FP32 = 0, 1, 2, 3, 4, 5

# gtp_drain_ex flags
DRAIN_DEFER_HEAD, DRAIN_MIDSTEP = 1, 2

# gtp_bootstrap_result_t and the vtable version of comm/bootstrap_callbacks.h
BOOTSTRAP_OK, BOOTSTRAP_ERROR, BOOTSTRAP_TIMEOUT = 0, 1, 2
BOOTSTRAP_CALLBACKS_VERSION = 1

c_status = ctypes.c_int  # C enums are int-sized


class gtp_weight_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int64), ("generation", ctypes.c_uint64)]


def _error_on_exception(prototype, result):
    """The ctypes callback type `prototype` whose Python function returns `result` to C when it raises:
    plain ctypes prints the exception and returns 0, which the bootstrap vtable reads as success."""
    class Guarded(prototype):
        _argtypes_, _restype_, _flags_ = prototype._argtypes_, prototype._restype_, prototype._flags_

        def __new__(cls, fn):
            def call(*args):
                try:
                    return fn(*args)
                except BaseException:  # noqa: BLE001 - nothing may unwind through C
                    traceback.print_exc()
                    return result
            return super().__new__(cls, call)

        def __init__(self, fn):  # the function was bound in __new__
            pass

    return Guarded


ALLGATHER_FN = _error_on_exception(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                    ctypes.c_size_t, ctypes.c_int64), BOOTSTRAP_ERROR)
BROADCAST_FN = _error_on_exception(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.c_int32, ctypes.c_int64), BOOTSTRAP_ERROR)
BARRIER_FN = _error_on_exception(ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64), BOOTSTRAP_ERROR)
# Returns const char*: declared c_void_p so the callee keeps ownership of a buffer we keep alive.
LAST_ERROR_FN = _error_on_exception(ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p), None)  # raising: no text
GRAD_READY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, gtp_weight_t)


class gtp_bootstrap_callbacks_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("version", ctypes.c_uint32), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("user_data", ctypes.c_void_p), ("allgather", ALLGATHER_FN),
                ("broadcast", BROADCAST_FN), ("barrier", BARRIER_FN), ("last_error", LAST_ERROR_FN)]


class gtp_context_config_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("header_version", ctypes.c_uint32),
                ("bootstrap", ctypes.c_int), ("callbacks", ctypes.POINTER(gtp_bootstrap_callbacks_t)),
                ("timeout_ms", ctypes.c_int64), ("backend", ctypes.c_int), ("profile_json", ctypes.c_char_p),
                ("profile_path", ctypes.c_char_p), ("prefetch_depth", ctypes.c_int32),
                ("memory_budget_bytes", ctypes.c_int64), ("accumulate_microbatches", ctypes.c_int32),
                ("trace_spans", ctypes.c_size_t), ("grad_ready", GRAD_READY_FN),
                ("grad_ready_user_data", ctypes.c_void_p),
                ("call_timeout_ms", ctypes.c_int64),  # appended after 0.7.0
                ("sum_grads", ctypes.c_int32),  # appended after 0.7.1
                ("check_every_fill", ctypes.c_int32)]  # appended after 0.7.1


class gtp_sizes_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, ctypes.c_int32) for name in (
        "rank", "world_size", "tp", "gtp_remat", "expert_gtp_remat", "dp", "data_parallel_index",
        "data_parallel_count", "tp_rank", "gtp_remat_rank", "expert_gtp_remat_rank", "dp_rank")]  # ranks since 0.7


class gtp_weight_desc_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("shard", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64), ("wire", ctypes.c_int),
                ("group", ctypes.c_int), ("main_grad", ctypes.c_void_p),
                ("expert_leader", ctypes.POINTER(gtp_weight_t)),
                ("nvfp4_2d", ctypes.c_int32), ("mx_rounding", ctypes.c_int32),  # since 0.3
                ("gemm_scale_layout", ctypes.c_int32)]  # since 0.5


# gtp_grad_buffer_ex flags (since 0.4)
GRAD_BUFFER_UNINITIALIZED = 1
GRAD_BUFFER_SEPARATE = 2  # since 0.6


class gtp_grad_buffer_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data", ctypes.c_void_p), ("overwrite", ctypes.c_int32)]


class gtp_section_t(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("ld", ctypes.c_int64)]


class gtp_materialized_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("layout", ctypes.c_int), ("wire", ctypes.c_int),
                ("nvfp4_2d", ctypes.c_int32), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("data", gtp_section_t), ("scales", gtp_section_t), ("data_t", gtp_section_t),
                ("scales_t", gtp_section_t), ("decode_scales", gtp_section_t), ("gemm_rows", ctypes.c_int64),
                ("decode_scale_rows", ctypes.c_int64), ("scale_block_rows", ctypes.c_int32),
                ("scale_block_cols", ctypes.c_int32), ("scale_layout", ctypes.c_int32)]  # since 0.5


def _candidates():
    """Where libgtp.so is looked for, in the order of library_path()'s docstring."""
    env = os.environ.get("GTP_LIBRARY")
    if env:
        yield env, "GTP_LIBRARY"
        return
    package = os.path.dirname(os.path.abspath(__file__))
    # In the package (the wheel's gtp/libgtp.so), beside it, and PREFIX/lib for the installed layout
    # PREFIX/lib/python/gtp of //:install.
    for folder in (package, os.path.dirname(package), os.path.dirname(os.path.dirname(package))):
        yield os.path.join(folder, "libgtp.so"), "next to the package"
    folder = package
    while True:
        yield os.path.join(folder, "bazel-bin", "bindings", "c", "libgtp.so"), "Bazel output"
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent


def find_library():
    tried = []
    for path, how in _candidates():
        if os.path.isfile(path):
            return path
        tried.append(f"{path} ({how})")
    raise OSError("libgtp.so not found; tried " + ", ".join(tried) +
                  ". Build it with `bazel build //bindings/c:libgtp.so`, install it with "
                  "`bazel run //:install -- PREFIX`, or set GTP_LIBRARY to its path")


def _declare(lib):
    P = ctypes.POINTER
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    w = gtp_weight_t
    signatures = {
        "gtp_status_string": (ctypes.c_char_p, [c_status]),
        "gtp_last_error": (ctypes.c_char_p, [vp]),
        "gtp_context_create": (c_status, [P(gtp_context_config_t), P(vp)]),
        "gtp_context_destroy": (c_status, [vp]),
        "gtp_context_abort": (c_status, [vp]),
        "gtp_context_check": (c_status, [vp]),
        "gtp_context_sizes": (c_status, [vp, P(gtp_sizes_t)]),
        "gtp_weight_register": (c_status, [vp, P(gtp_weight_desc_t), P(w)]),
        "gtp_weight_unregister": (c_status, [vp, w]),
        "gtp_weights_shard_updated": (c_status, [vp, P(w), sz, vp]),
        "gtp_weight_amax": (c_status, [vp, w, P(P(ctypes.c_float))]),  # since 0.7.1
        "gtp_materialize": (c_status, [vp, P(w), sz, ctypes.c_int, ctypes.c_int32, ctypes.c_int, P(vp), sz, P(sz), vp]),
        "gtp_release": (c_status, [vp, P(w), sz, vp]),
        "gtp_materialize_views": (c_status, [vp, P(w), sz, ctypes.c_int, ctypes.c_int32, ctypes.c_int,
                                             P(gtp_materialized_t), sz, P(sz), vp]),
        "gtp_release_layout": (c_status, [vp, P(w), sz, ctypes.c_int, vp]),
        "gtp_grad_buffer": (c_status, [vp, w, P(P(ctypes.c_float)), vp]),
        "gtp_grad_buffer_ex": (c_status, [vp, w, ctypes.c_uint32, P(gtp_grad_buffer_t), vp]),
        "gtp_finalize": (c_status, [vp, P(w), sz, ctypes.c_int32, vp]),
        "gtp_drain": (c_status, [vp, vp]),
        "gtp_drain_ex": (c_status, [vp, ctypes.c_uint32, vp]),
        "gtp_reset_chains": (c_status, [vp]),
        "gtp_main_grads_zeroed": (c_status, [vp, P(w), sz]),
        "gtp_stats_json": (c_status, [vp, ctypes.c_char_p, sz, P(sz)]),
        "gtp_trace_json": (c_status, [vp, ctypes.c_char_p, sz, P(sz)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_lib = None
_lib_path = None


def _preload_pip_nccl():
    """Loads the NCCL of the pip package nvidia-nccl (what torch's CUDA wheels link), if installed,
    before libgtp: libnccl.so.2 is one soname per process, and libgtp's own search would otherwise find
    the CUDA toolkit's older copy first, after which `import torch` fails on a missing NCCL symbol.
    libgtp uses only long-standing NCCL calls, which the newer library keeps."""
    try:
        import nvidia.nccl  # a namespace package: no code runs
    except ImportError:
        return
    for folder in getattr(nvidia.nccl, "__path__", []):
        candidate = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(candidate):
            ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            return


def lib():
    """The loaded libgtp (loaded once per process)."""
    global _lib, _lib_path
    if _lib is None:
        path = find_library()
        _preload_pip_nccl()
        loaded = ctypes.CDLL(path)
        _declare(loaded)
        _lib, _lib_path = loaded, path
    return _lib


def library_path():
    """The path of the libgtp.so this process loaded (loading it on first use), the first found of:

    1. ``$GTP_LIBRARY`` when set (then nothing else is tried; a missing file is an error);
    2. ``gtp/libgtp.so`` inside the package: what the wheel (``pip install libgtp-*.whl``) bundles;
    3. beside the package, then ``PREFIX/lib/libgtp.so`` for ``//:install``'s ``PREFIX/lib/python/gtp``;
    4. ``bazel-bin/bindings/c/libgtp.so`` of a checkout above the package (``PYTHONPATH=bindings/python``).
    """
    lib()
    return _lib_path

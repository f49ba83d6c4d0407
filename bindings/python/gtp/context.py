"""gtp.Context: a libgtp context as a Python object (ctypes + numpy, no framework): its creation,
lifetime, queries and weight registry. The calls of a step are its base class StepCalls (step_calls.py)."""
import ctypes
import itertools
import json
from dataclasses import dataclass

import numpy as np

from . import _lib
from ._checks import (INT32_MAX, INT64_MAX, UINT64_MAX, c_string, choice, integer, milliseconds, profile_wires,
                      read_profile)
from ._enums import BACKENDS, DTYPES, GROUPS, MX_ROUNDINGS, SCALE_LAYOUTS, WIRES
from .bootstrap import KVBootstrap
from .errors import check
from .step_calls import StepCalls
from .weight import Weight, shard_geometry

# What gtp.context held before the step calls, the weight's types and the numpy helpers moved to their
# own modules: `from gtp.context import host_array` and pickles that name these here still resolve.
from ._enums import ELEMS, LAYOUTS, PHASES  # noqa: F401
from .host_arrays import bf16_bits_to_float32, float32_to_bf16_bits, host_array, ring_mean  # noqa: F401
from .step_calls import GradBuffer  # noqa: F401
from .weight import Materialized, Section, ShardGeometry, column_multiple, row_alignment  # noqa: F401

# Contexts created by this process, numbering their store keys (every rank creates them in one order).
_context_numbers = itertools.count()


@dataclass(frozen=True)
class Sizes:
    rank: int
    world_size: int
    tp: int
    gtp_remat: int
    expert_gtp_remat: int
    dp: int
    data_parallel_index: int
    data_parallel_count: int
    tp_rank: int  # this rank's position in each of its groups (since 0.7)
    gtp_remat_rank: int
    expert_gtp_remat_rank: int
    dp_rank: int


class Context(StepCalls):
    """A libgtp context. Collective: every rank of the bootstrap creates it (same order, same store).

    store: an object with set/get (see gtp.bootstrap), or None to bootstrap over UCX from the
    environment gtp-launch sets (GTP_RANK, GTP_WORLD_SIZE, GTP_ROOT_ADDR).
    grad_ready: optional callable(weight) run after a weight's main-grad add (inside finalize or drain);
    host backend only (ValueError with backend="cuda").
    prefetch_depth, memory_budget_bytes: None takes each group's own profile settings (GTP_FROM_PROFILE);
    a number sets every group (the budget is each group's).
    backend="cuda" runs on the CUDA device current when the context is created (torch.cuda.set_device).
    sum_grads=True reduce-scatters each weight gradient as the sum over its group instead of the mean
    (Megatron's calculate_per_token_loss); every rank must pass the same.
    check_every_fill=True checks that the ranks of a group gather the same weights at every gather,
    before it is unpacked (a small collective beside each); the default checks once per step, at
    drain (docs/reliability.md, Ranks that disagree). Every rank must pass the same.
    Use it as a context manager, or call close() (collective) at the end.
    """

    def __init__(self, store=None, rank=None, world_size=None, *, backend="host", timeout_s=60.0,
                 profile_json=None, profile_path=None, prefetch_depth=None, memory_budget_bytes=None,
                 accumulate_microbatches=False, trace_spans=0, grad_ready=None, header_version=None,
                 call_timeout_s=None, sum_grads=False, check_every_fill=False):
        self._lib = _lib.lib()
        self._handle = None
        self._weights = {}
        self._callback_error = None
        self.grad_ready = grad_ready
        config = _lib.gtp_context_config_t()
        config.struct_size = ctypes.sizeof(_lib.gtp_context_config_t)
        config.header_version = (_lib.HEADER_VERSION if header_version is None
                                 else integer(header_version, "header_version", 0, 2**32 - 1))
        number = next(_context_numbers)
        self._bootstrap = None
        if store is None:
            config.bootstrap = _lib.BOOTSTRAP_UCX_FROM_ENV
        else:
            if rank is None or world_size is None:
                raise ValueError("a store needs rank= and world_size= (this process's place among the ranks)")
            integer(world_size, "world_size", 1, INT32_MAX)
            integer(rank, "rank", 0, world_size - 1)
            self._bootstrap = KVBootstrap(store, rank, world_size, prefix=f"gtp/context{number}")
            config.bootstrap = _lib.BOOTSTRAP_CALLBACKS
            config.callbacks = ctypes.pointer(self._bootstrap.vtable)
        # Any finite number of seconds from 1 ms on; "very long" is not "no timeout".
        config.timeout_ms = milliseconds(timeout_s, "timeout_s")
        # Each collective's deadline (gtp_context_check); None: timeout_s.
        config.call_timeout_ms = 0 if call_timeout_s is None else milliseconds(call_timeout_s, "call_timeout_s")
        config.backend = choice(BACKENDS, backend, "backend")
        self._profile = [None if p is None else c_string(p, what, path=what == "profile_path")
                         for p, what in ((profile_json, "profile_json"), (profile_path, "profile_path"))]
        profile_text = (self._profile[0].decode("utf-8", errors="replace") if profile_json is not None
                        else read_profile(profile_path))
        config.profile_json, config.profile_path = self._profile
        config.prefetch_depth = (_lib.FROM_PROFILE if prefetch_depth is None
                                 else integer(prefetch_depth, "prefetch_depth", 0, _lib.MAX_DEPTH))
        config.memory_budget_bytes = (_lib.FROM_PROFILE if memory_budget_bytes is None
                                      else integer(memory_budget_bytes, "memory_budget_bytes", 0, INT64_MAX))
        config.accumulate_microbatches = 1 if accumulate_microbatches else 0
        self.accumulate_microbatches = bool(accumulate_microbatches)
        if not isinstance(sum_grads, bool):
            raise TypeError(f"sum_grads={sum_grads!r}: pass True (reduce-scatter sums over the group, Megatron's "
                            "calculate_per_token_loss) or False (means, the default)")
        config.sum_grads = 1 if sum_grads else 0
        self.sum_grads = sum_grads
        if not isinstance(check_every_fill, bool):
            raise TypeError(f"check_every_fill={check_every_fill!r}: pass True (check every gather, for debugging) "
                            "or False (check once per step at drain, the default)")
        config.check_every_fill = 1 if check_every_fill else 0
        config.trace_spans = integer(trace_spans, "trace_spans", 0, UINT64_MAX)  # libgtp names its own limit
        # On the host backend always installed (kept alive here): it dispatches to self.grad_ready, which
        # may change later. On CUDA libgtp runs it on the driver's host-function thread, where entering
        # Python could deadlock on the GIL against a thread waiting for that stream: not installed.
        if backend == "cuda" and grad_ready is not None:
            raise ValueError("grad_ready is not supported with backend='cuda': libgtp calls it on CUDA's "
                             "host-function thread, which must not enter Python; use gtp.torch's "
                             "register_grad_ready_hook (run at drain) or poll after drain")
        self._grad_ready_fn = _lib.GRAD_READY_FN(self._on_grad_ready) if backend != "cuda" else None
        if self._grad_ready_fn is not None:
            config.grad_ready = self._grad_ready_fn
        self.backend = backend
        handle = ctypes.c_void_p()
        check(self._lib.gtp_context_create(ctypes.byref(config), ctypes.byref(handle)), None)
        self._handle = handle
        self.sizes = self._sizes()
        self._group_wires = profile_wires(profile_text)

    def group_wire(self, group="gtp_remat"):
        """The wire name of `group`'s profile settings ("bf16" without them): what wire="from_group" uses."""
        choice(GROUPS, group, "group")
        return self._group_wires[group][0]

    # -- lifetime --
    def close(self):
        """Destroys the context (collective). Its weights become stale. Safe to call twice."""
        if self._handle is None:
            return
        status = self._lib.gtp_context_destroy(self._handle)
        if status != _lib.ERROR_INVALID_STATE:  # INVALID_STATE: refused (a call in progress), the context is whole
            self._handle = None
            self._weights.clear()
        check(status, None)

    def abort(self):
        self._call("gtp_context_abort")

    def check(self):
        """Watchdog poll (gtp_context_check), for a monitoring thread: returns while every collective is
        within call_timeout_s (tracked on the CUDA backend when call_timeout_s is given); raises
        gtp.TimeoutError naming the call and group once one is past it, after aborting the
        communicators so peers fail too."""
        self._call("gtp_context_check")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return self._handle is None

    def _ctx(self):
        if self._handle is None:
            raise RuntimeError("the gtp.Context is closed; create a new one")
        return self._handle

    def _call(self, name, *args):
        self._callback_error = None
        status = getattr(self._lib, name)(self._ctx(), *args)
        check(status, self._handle)
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise error

    def _on_grad_ready(self, _user, handle):
        try:
            weight = self._weights.get((handle.id, handle.generation))
            if self.grad_ready is not None and weight is not None:
                self.grad_ready(weight)
        except BaseException as e:  # noqa: BLE001 - raised again after the C call returns
            self._callback_error = e

    # -- queries --
    def _sizes(self):
        s = _lib.gtp_sizes_t()
        s.struct_size = ctypes.sizeof(_lib.gtp_sizes_t)
        self._call("gtp_context_sizes", ctypes.byref(s))
        return Sizes(*(getattr(s, f) for f, _ in _lib.gtp_sizes_t._fields_[1:]))

    @property
    def rank(self):
        return self.sizes.rank

    @property
    def world_size(self):
        return self.sizes.world_size

    def group_size(self, group="gtp_remat"):
        return self.sizes.gtp_remat if group == "gtp_remat" else self.sizes.expert_gtp_remat

    def group_rank(self, group="gtp_remat"):
        """This rank's position in its gtp_remat (or expert) group: it decides the rows the rank owns.
        libgtp's own answer (gtp_context_sizes, since 0.7): the order of the group's communicator, which
        for the expert group follows the expert view of the grid (etp, ep, expt_gtp_remat), not the dense one."""
        choice(GROUPS, group, "group")
        return self.sizes.gtp_remat_rank if group == "gtp_remat" else self.sizes.expert_gtp_remat_rank

    def geometry(self, rows, cols, wire="bf16", group="gtp_remat"):
        """wire=None or "from_group": the group's profile wire."""
        if wire is None or wire == "from_group":
            wire = self.group_wire(group)
        return shard_geometry(rows, cols, self.group_size(group), self.group_rank(group), wire)

    def _json(self, name):
        length = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(1)
        while True:  # a short buffer gives the length; the text may grow before the next try (a monitor thread)
            status = getattr(self._lib, name)(self._ctx(), buf, len(buf), ctypes.byref(length))
            if status == _lib.SUCCESS:
                return json.loads(buf.value.decode())
            if status != _lib.ERROR_INVALID_ARGUMENT or length.value < len(buf):
                check(status, self._handle)
            buf = ctypes.create_string_buffer(length.value + 1 + length.value // 4)

    def stats(self):
        """The runtime's stats (counters, cache, grads, memory, per weight) as a dict."""
        return self._json("gtp_stats_json")

    def trace(self):
        """A Chrome trace (dict) of the last trace_spans spans."""
        return self._json("gtp_trace_json")

    # -- weights --
    def register(self, name, shard, rows, cols, *, dtype=None, wire="bf16", group="gtp_remat", main_grad=None,
                 expert_leader=None, nvfp4_2d=False, mx_rounding="rceil", gemm_scales="row_major"):
        """Registers this rank's shard of a rows x cols weight.

        nvfp4_2d: NVFP4 16x16 scale blocks (their GEMM layout has the exact transpose); wire="nvfp4" only.
        wire: "bf16", "fp8", "mxfp8", "nvfp4", or None / "from_group" for the group's profile settings
        (GTP_WIRE_FROM_GROUP: its wire_format, nvfp4_blocks and mx_rounding; bf16 without a profile).
        mx_rounding: the MXFP8 E8M0 scale rule, "rceil" (TransformerEngine) or "floor" (OCP MX v1.0);
        ignored by the other wires. Experts must match their leader in both.
        gemm_scales: how the GEMM layout stores MXFP8 / NVFP4 block scales, "row_major" or "blocked_128x4"
        (the 128 x 4 tile order of cuBLASLt's block-scaled GEMMs, docs/formats.md "Blocked scales").

        shard, main_grad: numpy arrays (shard: float32, or uint16 holding BF16 bits; main_grad: float32),
        C-contiguous, shape (valid_rows, cols) as `geometry()` gives; or integer addresses with `dtype`
        given (the caller keeps that memory alive). main_grad=None: no gradient for this weight.
        """
        choice(GROUPS, group, "group")
        rows = integer(rows, "rows", -INT64_MAX - 1, INT64_MAX)  # int64_t; shard_geometry wants them positive
        cols = integer(cols, "cols", -INT64_MAX - 1, INT64_MAX)
        wire_code = None
        if wire is None or wire == "from_group":
            # libgtp resolves it; the same settings here give the geometry and the Weight's fields.
            wire, group_2d, group_rounding = self._group_wires[group]
            nvfp4_2d = bool(nvfp4_2d) or group_2d
            mx_rounding = "floor" if "floor" in (mx_rounding, group_rounding) else mx_rounding
            wire_code = _lib.WIRE_FROM_GROUP
        geometry = self.geometry(rows, cols, wire, group)
        keep = []
        if isinstance(shard, np.ndarray):
            kinds = {np.dtype(np.float32): "fp32", np.dtype(np.uint16): "bf16"}
            if shard.dtype not in kinds:
                raise ValueError(f"shard dtype {shard.dtype} is not float32 or uint16 (BF16 bits)")
            if dtype is not None and dtype != kinds[shard.dtype]:
                raise ValueError(f"dtype={dtype!r} but the shard array holds {kinds[shard.dtype]}")
            dtype = kinds[shard.dtype]
            self._check_array(shard, (geometry.valid_rows, cols), "shard", geometry)
            keep.append(shard)
            shard_ptr = shard.ctypes.data if geometry.valid_rows > 0 else None
        else:
            if dtype is None:
                raise ValueError("dtype= ('bf16' or 'fp32') is needed when shard is an address")
            shard_ptr = None if shard is None else integer(shard, "shard", 0, UINT64_MAX)
        if isinstance(main_grad, np.ndarray):
            if main_grad.dtype != np.float32:
                raise ValueError(f"main_grad dtype {main_grad.dtype} is not float32")
            self._check_array(main_grad, (geometry.valid_rows, cols), "main_grad", geometry)
            keep.append(main_grad)
            grad_ptr = main_grad.ctypes.data if geometry.valid_rows > 0 else None
        else:
            grad_ptr = None if main_grad is None else integer(main_grad, "main_grad", 0, UINT64_MAX)
        desc = _lib.gtp_weight_desc_t()
        desc.struct_size = ctypes.sizeof(_lib.gtp_weight_desc_t)
        encoded = c_string(name, "name")
        keep.append(encoded)
        desc.name = encoded
        desc.shard = shard_ptr
        desc.dtype = choice(DTYPES, dtype, "dtype")
        desc.rows, desc.cols = rows, cols
        desc.wire = choice(WIRES, wire, "wire") if wire_code is None else wire_code
        desc.group = choice(GROUPS, group, "group")
        desc.main_grad = grad_ptr
        desc.nvfp4_2d = 1 if nvfp4_2d else 0
        desc.mx_rounding = choice(MX_ROUNDINGS, mx_rounding, "mx_rounding")
        desc.gemm_scale_layout = choice(SCALE_LAYOUTS, gemm_scales, "gemm_scales")
        leader = None
        if expert_leader is not None:
            leader = _lib.gtp_weight_t(expert_leader.handle.id, expert_leader.handle.generation)
            desc.expert_leader = ctypes.pointer(leader)
        handle = _lib.gtp_weight_t()
        self._call("gtp_weight_register", ctypes.byref(desc), ctypes.byref(handle))
        weight = Weight(self, handle, encoded.decode("utf-8"), rows, cols, wire, group, geometry, keep,
                        bool(nvfp4_2d), mx_rounding)
        self._weights[weight.key] = weight
        if expert_leader is not None:
            expert_leader.experts.append(weight)
        return weight

    @staticmethod
    def _check_array(array, shape, what, geometry):
        if tuple(array.shape) != shape or not array.flags.c_contiguous:
            raise ValueError(f"{what} has shape {tuple(array.shape)} (contiguous: {array.flags.c_contiguous}) but this "
                             f"rank's shard is {shape}: rows [{geometry.row_start}, "
                             f"{geometry.row_start + geometry.valid_rows}) of the weight; take it from geometry()")

    def unregister(self, weight):
        self._call("gtp_weight_unregister", weight.handle)
        self._weights.pop(weight.key, None)
        for leader in self._weights.values():
            if weight in leader.experts:
                leader.experts.remove(weight)


"""Context and Weight: the C ABI of gtp.h as Python objects (ctypes + numpy, no framework)."""
import ctypes
import itertools
import json
import math
import numbers
from dataclasses import dataclass

import numpy as np

from . import _lib
from ._checks import INT32_MAX, INT64_MAX, UINT64_MAX, c_string, integer as _integer, profile_wires, read_profile
from .bootstrap import KVBootstrap
from .errors import check

WIRES = {"bf16": _lib.WIRE_BF16, "fp8": _lib.WIRE_FP8, "mxfp8": _lib.WIRE_MXFP8, "nvfp4": _lib.WIRE_NVFP4}
PHASES = {"forward": _lib.PHASE_FORWARD, "backward": _lib.PHASE_BACKWARD, "recompute": _lib.PHASE_RECOMPUTE}
GROUPS = {"gtp_remat": _lib.GROUP_GTP_REMAT, "expert_gtp_remat": _lib.GROUP_EXPERT_GTP_REMAT}
BACKENDS = {"host": _lib.BACKEND_HOST, "cuda": _lib.BACKEND_CUDA}
DTYPES = {"bf16": _lib.DTYPE_BF16, "fp32": _lib.DTYPE_FP32}
MX_ROUNDINGS = {"rceil": _lib.MX_ROUNDING_RCEIL, "floor": _lib.MX_ROUNDING_FLOOR}
SCALE_LAYOUTS = {"row_major": _lib.SCALE_LAYOUT_ROW_MAJOR, "blocked_128x4": _lib.SCALE_LAYOUT_BLOCKED_128X4}
_SCALE_LAYOUT_NAMES = {v: k for k, v in SCALE_LAYOUTS.items()}
LAYOUTS = {"bf16": _lib.LAYOUT_BF16, "gemm": _lib.LAYOUT_GEMM}
_LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
_WIRE_NAMES = {v: k for k, v in WIRES.items()}
# gtp_elem_t -> (name, numpy dtype of the stored bytes, elements per stored item). Codes and scales are
# raw bytes (uint8; E2M1 packs two elements per byte, element 2k in the low nibble), BF16 is uint16 bits.
ELEMS = {_lib.ELEM_BF16: ("bf16", np.uint16, 1), _lib.ELEM_E4M3: ("e4m3", np.uint8, 1),
         _lib.ELEM_E2M1: ("e2m1", np.uint8, 2), _lib.ELEM_E8M0: ("e8m0", np.uint8, 1),
         _lib.ELEM_FP32: ("fp32", np.float32, 1)}

# Contexts created by this process, numbering their store keys (every rank creates them in one order).
_context_numbers = itertools.count()


def _choice(table, value, what):
    if value not in table:
        raise ValueError(f"{what}={value!r} is unknown; use one of {sorted(table)}")
    return table[value]


def _stream(stream):
    """A cudaStream_t as ctypes wants it: None (NULL, the host backend) or the stream's integer handle."""
    return None if stream is None else ctypes.c_void_p(int(stream))


@dataclass(frozen=True)
class ShardGeometry:
    """Where one rank's shard sits in the TP-local weight (the rule of kernels::weight_geometry)."""
    rows: int          # TP-local rows (out_features / TP)
    cols: int
    group_size: int    # G
    padded_rows: int   # rows rounded up to row_alignment(wire) x G
    shard_rows: int    # padded_rows / G, the rows every rank holds (padding included)
    row_start: int     # first global row of this rank's shard
    valid_rows: int    # rows of this rank's shard that hold weight rows (0: only padding)


def row_alignment(wire):
    return 32 if wire == "mxfp8" else 16


def column_multiple(wire):
    return 32 if wire == "mxfp8" else 16


def shard_geometry(rows, cols, group_size, group_rank, wire="bf16"):
    """Rows [row_start, row_start + valid_rows) of a rows x cols weight are rank `group_rank`'s shard."""
    _choice(WIRES, wire, "wire")
    if rows <= 0 or cols <= 0 or group_size <= 0 or not (0 <= group_rank < group_size):
        raise ValueError(f"rows={rows}, cols={cols}, group_size={group_size}, group_rank={group_rank}: "
                         "sizes must be positive and 0 <= group_rank < group_size")
    align = row_alignment(wire) * group_size
    padded = (rows + align - 1) // align * align
    shard_rows = padded // group_size
    start = group_rank * shard_rows
    valid = max(0, min(shard_rows, rows - start))
    return ShardGeometry(rows, cols, group_size, padded, shard_rows, start, valid)


@dataclass
class Section:
    """One row-major section of a materialized weight (gtp_section_t): `rows x cols` elements, `ld`
    elements from one row to the next. `array`: a numpy view (host backend; None on CUDA, where
    gtp.torch sets `tensor`). Valid until the release of its materialization."""
    address: int
    dtype: str            # "bf16", "e4m3", "e2m1" (two per byte), "e8m0", "fp32"
    rows: int
    cols: int
    ld: int
    array: object = None  # numpy view of the stored items: uint16 (BF16 bits), uint8 (codes, scales), float32
    tensor: object = None  # gtp.torch: the same memory as a torch tensor (CPU or CUDA)

    @property
    def storage(self):
        """(numpy dtype, items per row, items from one row to the next) of the stored items."""
        _, np_dtype, per_item = next(e for e in ELEMS.values() if e[0] == self.dtype)
        return np_dtype, self.cols // per_item, self.ld // per_item


@dataclass
class Materialized:
    """One materialized weight (gtp_materialized_t) with its sections; absent sections are None."""
    weight: "Weight"
    layout: str           # what was produced: "bf16" (BF16 layout, or the GEMM layout of the BF16 wire) or "gemm"
    wire: str
    nvfp4_2d: bool
    rows: int
    cols: int
    data: Section
    scales: Section
    data_t: Section
    scales_t: Section
    decode_scales: Section
    gemm_rows: int
    decode_scale_rows: int
    scale_block: tuple    # (rows, cols) of elements one scale covers; (0, 0) without scales
    scale_layout: str = "row_major"  # of scales / scales_t: "row_major" or "blocked_128x4" (cuBLASLt tile order)

    def sections(self):
        return {name: getattr(self, name) for name in ("data", "scales", "data_t", "scales_t", "decode_scales")
                if getattr(self, name) is not None}


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


@dataclass(frozen=True)
class GradBuffer:
    """Context.grad_buffer_ex's answer: the buffer's address, and whether the wgrad must be written into
    it (overwrite: the rows hold garbage) or added (a buffer already handed out this step)."""
    address: int
    overwrite: bool


class Weight:
    """A registered weight. Holds references to the memory it was registered with (shard, main_grad)
    so it cannot be freed while libgtp points at it."""

    def __init__(self, context, handle, name, rows, cols, wire, group, geometry, keep_alive, nvfp4_2d=False,
                 mx_rounding="rceil"):
        self.context, self.handle, self.name = context, handle, name
        self._handle_array = (_lib.gtp_weight_t * 1)(handle)  # what a call naming only this weight passes
        self.rows, self.cols, self.wire, self.group, self.geometry = rows, cols, wire, group, geometry
        self.nvfp4_2d, self.mx_rounding = nvfp4_2d, mx_rounding
        self._keep_alive = keep_alive
        self.experts = []  # a leader's experts, in registration order (they follow it in materialize)
        self.user = None  # whatever the caller attaches (gtp.torch puts its parameter here)

    @property
    def key(self):
        return (self.handle.id, self.handle.generation)

    def unregister(self):
        self.context.unregister(self)

    def __repr__(self):
        return f"gtp.Weight({self.name!r}, {self.rows}x{self.cols}, wire={self.wire}, id={self.handle.id})"


def _milliseconds(seconds, name):
    """A timeout in seconds as libgtp's milliseconds: finite, from 1 ms to INT64_MAX ms ("very long")."""
    finite = isinstance(seconds, numbers.Real) and math.isfinite(seconds)
    if not (finite and 0.001 <= seconds <= INT64_MAX / 1000):
        raise ValueError(f"{name}={seconds!r} is outside [0.001, {INT64_MAX / 1000:.3g}] seconds")
    return min(int(seconds * 1000), INT64_MAX)


class Context:
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
                                 else _integer(header_version, "header_version", 0, 2**32 - 1))
        number = next(_context_numbers)
        self._bootstrap = None
        if store is None:
            config.bootstrap = _lib.BOOTSTRAP_UCX_FROM_ENV
        else:
            if rank is None or world_size is None:
                raise ValueError("a store needs rank= and world_size= (this process's place among the ranks)")
            _integer(world_size, "world_size", 1, INT32_MAX)
            _integer(rank, "rank", 0, world_size - 1)
            self._bootstrap = KVBootstrap(store, rank, world_size, prefix=f"gtp/context{number}")
            config.bootstrap = _lib.BOOTSTRAP_CALLBACKS
            config.callbacks = ctypes.pointer(self._bootstrap.vtable)
        # Any finite number of seconds from 1 ms on; "very long" is not "no timeout".
        config.timeout_ms = _milliseconds(timeout_s, "timeout_s")
        # Each collective's deadline (gtp_context_check); None: timeout_s.
        config.call_timeout_ms = 0 if call_timeout_s is None else _milliseconds(call_timeout_s, "call_timeout_s")
        config.backend = _choice(BACKENDS, backend, "backend")
        self._profile = [None if p is None else c_string(p, what, path=what == "profile_path")
                         for p, what in ((profile_json, "profile_json"), (profile_path, "profile_path"))]
        profile_text = (self._profile[0].decode("utf-8", errors="replace") if profile_json is not None
                        else read_profile(profile_path))
        config.profile_json, config.profile_path = self._profile
        config.prefetch_depth = (_lib.FROM_PROFILE if prefetch_depth is None
                                 else _integer(prefetch_depth, "prefetch_depth", 0, _lib.MAX_DEPTH))
        config.memory_budget_bytes = (_lib.FROM_PROFILE if memory_budget_bytes is None
                                      else _integer(memory_budget_bytes, "memory_budget_bytes", 0, INT64_MAX))
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
        config.trace_spans = _integer(trace_spans, "trace_spans", 0, UINT64_MAX)  # libgtp names its own limit
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
        _choice(GROUPS, group, "group")
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
        """This rank's position in its gtp_remat (or expert) group: it decides the rows the rank owns."""
        if group == "gtp_remat":
            return (self.rank // self.sizes.tp) % self.sizes.gtp_remat  # the grid: tp fastest, gtp_remat next
        eg = self.sizes.expert_gtp_remat
        if eg in (1, self.world_size):
            return self.rank % eg
        raise ValueError(f"the expert group's rank for EG={eg} < world size {self.world_size} follows the expert "
                         "view of the grid (etp, ep, expt_gtp_remat); compute it and use gtp.shard_geometry")

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
        _choice(GROUPS, group, "group")
        rows = _integer(rows, "rows", -INT64_MAX - 1, INT64_MAX)  # int64_t; shard_geometry wants them positive
        cols = _integer(cols, "cols", -INT64_MAX - 1, INT64_MAX)
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
            shard_ptr = None if shard is None else _integer(shard, "shard", 0, UINT64_MAX)
        if isinstance(main_grad, np.ndarray):
            if main_grad.dtype != np.float32:
                raise ValueError(f"main_grad dtype {main_grad.dtype} is not float32")
            self._check_array(main_grad, (geometry.valid_rows, cols), "main_grad", geometry)
            keep.append(main_grad)
            grad_ptr = main_grad.ctypes.data if geometry.valid_rows > 0 else None
        else:
            grad_ptr = None if main_grad is None else _integer(main_grad, "main_grad", 0, UINT64_MAX)
        desc = _lib.gtp_weight_desc_t()
        desc.struct_size = ctypes.sizeof(_lib.gtp_weight_desc_t)
        encoded = c_string(name, "name")
        keep.append(encoded)
        desc.name = encoded
        desc.shard = shard_ptr
        desc.dtype = _choice(DTYPES, dtype, "dtype")
        desc.rows, desc.cols = rows, cols
        desc.wire = _choice(WIRES, wire, "wire") if wire_code is None else wire_code
        desc.group = _choice(GROUPS, group, "group")
        desc.main_grad = grad_ptr
        desc.nvfp4_2d = 1 if nvfp4_2d else 0
        desc.mx_rounding = _choice(MX_ROUNDINGS, mx_rounding, "mx_rounding")
        desc.gemm_scale_layout = _choice(SCALE_LAYOUTS, gemm_scales, "gemm_scales")
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

    @staticmethod
    def _handles(weights):
        weights = list(weights)
        if len(weights) == 1 and isinstance(weights[0], Weight):  # the hot path: one array per weight, built once
            return weights[0]._handle_array, 1
        array = (_lib.gtp_weight_t * len(weights))(*[w.handle for w in weights])
        return array, len(weights)

    def shard_updated(self, weights, stream=None):
        """Collective re-pack after the optimizer changed the shards (and once before the first materialize)."""
        handles, n = self._handles(weights)
        self._call("gtp_weights_shard_updated", handles, n, _stream(stream))

    def weight_amax(self, weight):
        """gtp_weight_amax: the address of the FP32 amax an FP8 or NVFP4 weight was last packed with (the
        largest finite |x| of the whole weight, reduced over its group by the latest shard_updated):
        device memory on CUDA (read it on a stream ordered after a materialize of the weight), host
        memory on the host backend. No copy. Valid until another FP8 / NVFP4 weight is registered in the
        same group, this one is unregistered or the context closes: ask again after registering."""
        out = ctypes.POINTER(ctypes.c_float)()
        self._call("gtp_weight_amax", weight.handle, ctypes.byref(out))
        return ctypes.cast(out, ctypes.c_void_p).value

    def materialize(self, weights, phase="forward", model_chunk=0, stream=None):
        """Collective. Addresses of the full BF16 rows x cols weights (experts after their leader), valid
        until the matching release() (and, on CUDA, for work ordered on `stream` before it)."""
        handles, n = self._handles(weights)
        capacity = sum(1 + len(w.experts) for w in weights)
        ptrs = (ctypes.c_void_p * capacity)()
        count = ctypes.c_size_t()
        self._call("gtp_materialize", handles, n, _choice(PHASES, phase, "phase"),
                   _integer(model_chunk, "model_chunk", 0, INT32_MAX), _lib.LAYOUT_BF16, ptrs,
                   capacity, ctypes.byref(count), _stream(stream))
        return [ptrs[i] for i in range(count.value)]

    def materialize_arrays(self, weights, phase="forward", model_chunk=0):
        """Host backend: the materialized weights as numpy uint16 arrays of BF16 bits, shape (rows, cols),
        without a copy. They alias libgtp's cache: read them before release(), never after."""
        weights = list(weights)
        ptrs = self.materialize(weights, phase, model_chunk)
        shapes = [(w.rows, w.cols) for w in weights]
        if len(ptrs) != len(shapes):  # an expert group: every member has the leader's shape
            shapes = [shapes[0]] * len(ptrs)
        return [host_array(p, s, np.uint16) for p, s in zip(ptrs, shapes)]

    def materialize_views(self, weights, phase="forward", model_chunk=0, layout="gemm", stream=None):
        """Collective. One Materialized per expanded weight (experts after their leader). layout="gemm":
        the GEMM-ready codes, scales, exact transposes and decode scales of FP8 / MXFP8 / NVFP4 (the BF16
        weight on the BF16 wire); "bf16": the BF16 weight. The two layouts are two materializations, each
        ended by release(weights, layout=...). Sections on the host backend carry numpy views."""
        weights = list(weights)
        handles, n = self._handles(weights)
        code = _choice(LAYOUTS, layout, "layout")
        capacity = sum(1 + len(w.experts) for w in weights)
        out = (_lib.gtp_materialized_t * capacity)()
        for entry in out:
            entry.struct_size = ctypes.sizeof(_lib.gtp_materialized_t)
        count = ctypes.c_size_t()
        self._call("gtp_materialize_views", handles, n, _choice(PHASES, phase, "phase"),
                   _integer(model_chunk, "model_chunk", 0, INT32_MAX), code, out,
                   capacity, ctypes.byref(count), _stream(stream))
        members = [m for w in weights for m in [w] + list(w.experts)]
        return [self._materialized(members[i], out[i]) for i in range(count.value)]

    def _materialized(self, weight, m):
        def section(s):
            if s.dtype == _lib.ELEM_NONE:
                return None
            if s.dtype not in ELEMS:
                raise RuntimeError(f"libgtp returned section dtype {s.dtype}, unknown to this package "
                                   f"(written for gtp.h {_lib.VERSION_MAJOR}.{_lib.VERSION_MINOR})")
            out = Section(s.ptr, ELEMS[s.dtype][0], s.rows, s.cols, s.ld)
            if self.backend == "host":
                np_dtype, items, ld_items = out.storage
                out.array = host_array(s.ptr, (s.rows, ld_items), np_dtype)[:, :items]
            return out

        return Materialized(weight, _LAYOUT_NAMES[m.layout], _WIRE_NAMES[m.wire], bool(m.nvfp4_2d), m.rows, m.cols,
                            section(m.data), section(m.scales), section(m.data_t), section(m.scales_t),
                            section(m.decode_scales), m.gemm_rows, m.decode_scale_rows,
                            (m.scale_block_rows, m.scale_block_cols), _SCALE_LAYOUT_NAMES[m.scale_layout])

    def release(self, weights, stream=None, layout=None):
        """Ends the use opened by the matching materialize. layout=None works while the weights are held
        in one layout; held in both, name the one to end ("bf16" or "gemm", gtp_release_layout)."""
        handles, n = self._handles(weights)
        if layout is None:
            self._call("gtp_release", handles, n, _stream(stream))
        else:
            self._call("gtp_release_layout", handles, n, _choice(LAYOUTS, layout, "layout"), _stream(stream))

    def grad_buffer(self, weight, stream=None):
        """Address of the weight's FP32 wgrad buffer: padded_rows x cols, the first rows x cols are the
        weight's (add the wgrad there; padding rows stay zero). Same buffer until finalize()."""
        out = ctypes.POINTER(ctypes.c_float)()
        self._call("gtp_grad_buffer", weight.handle, ctypes.byref(out), _stream(stream))
        return ctypes.cast(out, ctypes.c_void_p).value

    def grad_buffer_ex(self, weight, uninitialized=True, stream=None, separate=False):
        """gtp_grad_buffer_ex: grad_buffer without the zero-fill (uninitialized=True). Returns a
        GradBuffer; write the wgrad when .overwrite (e.g. torch.mm(..., out=)), else add it. On a one-rank
        group the buffer is the main grad itself (add into it) unless separate=True
        (GTP_GRAD_BUFFER_SEPARATE: libgtp's own buffer, for a wgrad that can only be written)."""
        if separate and not uninitialized:
            raise ValueError("separate=True needs uninitialized=True: zero-filled buffers are always separate")
        out = _lib.gtp_grad_buffer_t()
        out.struct_size = ctypes.sizeof(_lib.gtp_grad_buffer_t)
        flags = ((_lib.GRAD_BUFFER_UNINITIALIZED if uninitialized else 0) |
                 (_lib.GRAD_BUFFER_SEPARATE if separate else 0))
        self._call("gtp_grad_buffer_ex", weight.handle, flags, ctypes.byref(out), _stream(stream))
        return GradBuffer(out.data, bool(out.overwrite))

    def grad_buffer_array(self, weight):
        """Host backend: the grad buffer's first rows x cols as a float32 numpy array (no copy)."""
        return host_array(self.grad_buffer(weight), (weight.rows, weight.cols), np.float32)

    def finalize(self, weights, last_microbatch=True, stream=None):
        """Collective reduce-scatter (mean over G) of the grad buffers into the main grads; the add is
        applied at the next finalize or drain, which also run grad_ready."""
        handles, n = self._handles(weights)
        self._call("gtp_finalize", handles, n, 1 if last_microbatch else 0, _stream(stream))

    def drain(self, stream=None, defer_head=False):
        """End-of-backward fence: pending main-grad adds (and grad_ready), chains end their step.
        defer_head: the next step's first weights are prefetched by the next shard_updated (after the
        optimizer's re-pack) instead of here, so they are gathered once, from the new shards."""
        self._call("gtp_drain_ex", _lib.DRAIN_DEFER_HEAD if defer_head else 0, _stream(stream))

    def reset_chains(self):
        self._call("gtp_reset_chains")

    def main_grads_zeroed(self, weights=None):
        """gtp_main_grads_zeroed: the main grads of `weights` (None: every weight with one) are zero now,
        zeroed on a stream ordered before the next grad_buffer calls'. Each weight's first grad buffer
        afterwards skips the main-grad add (on one rank it is the main grad, to write; at G > 1 its rows
        are copied). Call after drain, never under CUDA graph capture (docs/python.md)."""
        if weights is None:
            self._call("gtp_main_grads_zeroed", None, 0)
            return
        weights = list(weights)
        if weights:  # an empty list declares nothing (n = 0 would mean every weight)
            handles, n = self._handles(weights)
            self._call("gtp_main_grads_zeroed", handles, n)


def host_array(address, shape, dtype):
    """A numpy view of host memory at `address` (no copy; the memory's owner decides its lifetime)."""
    count = int(np.prod(shape))
    if count == 0:
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(address)
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def bf16_bits_to_float32(bits):
    """uint16 BF16 bits -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16_bits(values):
    """float32 -> uint16 BF16 bits as libgtp converts (docs/formats.md): round to nearest even, and
    every NaN becomes the canonical 0x7FFF."""
    v = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((v + 0x7FFF + ((v >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FFF), rounded)


def ring_mean(contributions, shard_rows):
    """The host backend's reduce-scatter mean, in its summation order, over full-size FP32 arrays (one
    per rank, rows padded to G x shard_rows): chunk c is summed from rank c+1 around the ring to rank c,
    then divided by G. Lets references match libgtp bit for bit."""
    size = len(contributions)
    out = np.empty_like(contributions[0], dtype=np.float32)
    for c in range(size):
        rows = slice(c * shard_rows, (c + 1) * shard_rows)
        total = np.array(contributions[(c + 1) % size][rows], dtype=np.float32)
        for step in range(2, size + 1):
            total = total + np.asarray(contributions[(c + step) % size][rows], dtype=np.float32)
        out[rows] = total / np.float32(size)
    return out

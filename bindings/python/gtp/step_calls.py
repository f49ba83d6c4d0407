"""Context's calls of a training step on registered weights: re-pack after the optimizer
(shard_updated), materialize / release, grad buffers, finalize, drain. A base class of gtp.Context,
apart from its creation, lifetime and queries only to keep each file short: it uses Context's _call
and backend and is never used alone."""
import ctypes
from dataclasses import dataclass

import numpy as np

from . import _lib
from ._checks import INT32_MAX, choice, integer
from ._enums import ELEMS, LAYOUT_NAMES, LAYOUTS, PHASES, SCALE_LAYOUT_NAMES, WIRE_NAMES
from .host_arrays import host_array
from .weight import Materialized, Section, Weight


def _stream(stream):
    """A cudaStream_t as ctypes wants it: None (NULL, the host backend) or the stream's integer handle."""
    return None if stream is None else ctypes.c_void_p(int(stream))


@dataclass(frozen=True)
class GradBuffer:
    """Context.grad_buffer_ex's answer: the buffer's address, and whether the wgrad must be written into
    it (overwrite: the rows hold garbage) or added (a buffer already handed out this step)."""
    address: int
    overwrite: bool


class StepCalls:
    """gtp.Context's calls on registered weights during a step (the module's docstring says why apart)."""

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
        self._call("gtp_materialize", handles, n, choice(PHASES, phase, "phase"),
                   integer(model_chunk, "model_chunk", 0, INT32_MAX), _lib.LAYOUT_BF16, ptrs,
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
        code = choice(LAYOUTS, layout, "layout")
        capacity = sum(1 + len(w.experts) for w in weights)
        out = (_lib.gtp_materialized_t * capacity)()
        for entry in out:
            entry.struct_size = ctypes.sizeof(_lib.gtp_materialized_t)
        count = ctypes.c_size_t()
        self._call("gtp_materialize_views", handles, n, choice(PHASES, phase, "phase"),
                   integer(model_chunk, "model_chunk", 0, INT32_MAX), code, out,
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

        return Materialized(weight, LAYOUT_NAMES[m.layout], WIRE_NAMES[m.wire], bool(m.nvfp4_2d), m.rows, m.cols,
                            section(m.data), section(m.scales), section(m.data_t), section(m.scales_t),
                            section(m.decode_scales), m.gemm_rows, m.decode_scale_rows,
                            (m.scale_block_rows, m.scale_block_cols), SCALE_LAYOUT_NAMES[m.scale_layout])

    def release(self, weights, stream=None, layout=None):
        """Ends the use opened by the matching materialize. layout=None works while the weights are held
        in one layout; held in both, name the one to end ("bf16" or "gemm", gtp_release_layout)."""
        handles, n = self._handles(weights)
        if layout is None:
            self._call("gtp_release", handles, n, _stream(stream))
        else:
            self._call("gtp_release_layout", handles, n, choice(LAYOUTS, layout, "layout"), _stream(stream))

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

    def drain(self, stream=None, defer_head=False, midstep=False):
        """End-of-backward fence: pending main-grad adds (and grad_ready), chains end their step.
        defer_head: the next step's first weights are prefetched by the next shard_updated (after the
        optimizer's re-pack) instead of here, so they are gathered once, from the new shards.
        midstep: more backward passes follow before the optimizer step, so the per-step divergence
        check waits for the drain that ends the step (one tag collective per step, not per drain)."""
        flags = (_lib.DRAIN_DEFER_HEAD if defer_head else 0) | (_lib.DRAIN_MIDSTEP if midstep else 0)
        self._call("gtp_drain_ex", flags, _stream(stream))

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


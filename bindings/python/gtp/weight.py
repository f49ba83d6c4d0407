"""A registered weight and what describes it: where each rank's shard sits (ShardGeometry), and a
materialized weight's sections (Materialized, Section), with numpy views on the host backend."""
from dataclasses import dataclass

from . import _lib
from ._checks import choice
from ._enums import ELEMS, WIRES


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
    choice(WIRES, wire, "wire")
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

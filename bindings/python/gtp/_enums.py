"""The names the Python API takes for gtp.h's enums (wire="fp8", phase="backward"...) and the C values
they stand for; the reverse tables name what libgtp hands back."""
import numpy as np

from . import _lib

WIRES = {"bf16": _lib.WIRE_BF16, "fp8": _lib.WIRE_FP8, "mxfp8": _lib.WIRE_MXFP8, "nvfp4": _lib.WIRE_NVFP4}
PHASES = {"forward": _lib.PHASE_FORWARD, "backward": _lib.PHASE_BACKWARD, "recompute": _lib.PHASE_RECOMPUTE}
GROUPS = {"gtp_remat": _lib.GROUP_GTP_REMAT, "expert_gtp_remat": _lib.GROUP_EXPERT_GTP_REMAT}
BACKENDS = {"host": _lib.BACKEND_HOST, "cuda": _lib.BACKEND_CUDA}
DTYPES = {"bf16": _lib.DTYPE_BF16, "fp32": _lib.DTYPE_FP32}
MX_ROUNDINGS = {"rceil": _lib.MX_ROUNDING_RCEIL, "floor": _lib.MX_ROUNDING_FLOOR}
SCALE_LAYOUTS = {"row_major": _lib.SCALE_LAYOUT_ROW_MAJOR, "blocked_128x4": _lib.SCALE_LAYOUT_BLOCKED_128X4}
SCALE_LAYOUT_NAMES = {v: k for k, v in SCALE_LAYOUTS.items()}
LAYOUTS = {"bf16": _lib.LAYOUT_BF16, "gemm": _lib.LAYOUT_GEMM}
LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
WIRE_NAMES = {v: k for k, v in WIRES.items()}
# gtp_elem_t -> (name, numpy dtype of the stored bytes, elements per stored item). Codes and scales are
# raw bytes (uint8; E2M1 packs two elements per byte, element 2k in the low nibble), BF16 is uint16 bits.
ELEMS = {_lib.ELEM_BF16: ("bf16", np.uint16, 1), _lib.ELEM_E4M3: ("e4m3", np.uint8, 1),
         _lib.ELEM_E2M1: ("e2m1", np.uint8, 2), _lib.ELEM_E8M0: ("e8m0", np.uint8, 1),
         _lib.ELEM_FP32: ("fp32", np.float32, 1)}

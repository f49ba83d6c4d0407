"""gtp: Python bindings of libgtp over its C ABI (ctypes; numpy for host-backend arrays).

Framework integration lives in gtp.torch. See docs/python.md.
"""
from ._lib import HEADER_VERSION, VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH, find_library, library_path
from .bootstrap import FileStore, KVBootstrap
from .context import Context, Sizes
from .errors import (CudaError, DivergedError, GtpError, InternalError, InvalidArgumentError, InvalidStateError, SystemError,
                     TimeoutError, VersionError)
from .host_arrays import bf16_bits_to_float32, float32_to_bf16_bits, host_array, ring_mean
from .step_calls import GradBuffer
from .weight import Materialized, Section, ShardGeometry, Weight, shard_geometry

__version__ = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"

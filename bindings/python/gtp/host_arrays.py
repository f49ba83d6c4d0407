"""numpy over the host backend's memory: views of what libgtp hands out, BF16 bits <-> float32 as
libgtp converts, and its reduce-scatter mean, so that references match libgtp bit for bit."""
import ctypes

import numpy as np


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

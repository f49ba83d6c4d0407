"""Checks of values the package hands to libgtp: names of enum values, integer ranges ctypes would
silently truncate, timeouts, C strings, and the profile's group wires (what wire="from_group" resolves to)."""
import json
import math
import numbers
import os
import stat

INT32_MAX, INT64_MAX, UINT64_MAX = 2**31 - 1, 2**63 - 1, 2**64 - 1
# Profile group names by Context group name (docs/profiles.md uses Megatron's).
_PROFILE_GROUPS = {"gtp_remat": "gtp_remat", "expert_gtp_remat": "expt_gtp_remat"}


def choice(table, value, what):
    """The C value `table` (gtp._enums) gives the name `value`, which must be one of its names."""
    if value not in table:
        raise ValueError(f"{what}={value!r} is unknown; use one of {sorted(table)}")
    return table[value]


def integer(value, what, low, high):
    """`value` as an int in [low, high], checked before ctypes would silently truncate it."""
    if type(value) is int and low <= value <= high:  # the hot path's case, without the ABC checks below
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what}={value!r} is not an integer")
    if not low <= int(value) <= high:
        raise ValueError(f"{what}={value} is outside [{low}, {high}]")
    return int(value)


def milliseconds(seconds, name):
    """A timeout in seconds as libgtp's milliseconds: finite, from 1 ms to INT64_MAX ms ("very long")."""
    finite = isinstance(seconds, numbers.Real) and math.isfinite(seconds)
    if not (finite and 0.001 <= seconds <= INT64_MAX / 1000):
        raise ValueError(f"{name}={seconds!r} is outside [0.001, {INT64_MAX / 1000:.3g}] seconds")
    return min(int(seconds * 1000), INT64_MAX)


def c_string(value, what, path=False):
    """`value` for a C string parameter: bytes as they are, a str in UTF-8 (a path, str or os.PathLike,
    in the file system's encoding, so a name os.listdir gave round-trips). A NUL inside would silently
    cut what C reads; a str UTF-8 cannot carry (a lone surrogate) is refused naming the parameter."""
    if path and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, (bytes, bytearray)):
        encoded = bytes(value)
    elif isinstance(value, str):
        try:
            encoded = os.fsencode(value) if path else value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{what}={value!r} cannot be encoded as UTF-8 (character {e.start} is "
                             f"{value[e.start]!r}, a lone surrogate): pass valid text") from None
    else:
        raise TypeError(f"{what}={value!r} is a {type(value).__name__}; pass a str"
                        + (", bytes or os.PathLike" if path else " or bytes"))
    nul = encoded.find(b"\0")
    if nul >= 0:
        raise ValueError(f"{what} has a NUL byte at offset {nul}: C would read only what precedes it; remove it")
    return encoded


def read_profile(path):
    """A profile file's text, read before create; None when create will refuse it (missing, not a
    regular file: a FIFO would block here, over 64 MiB), which then says why."""
    try:
        if path is None or not stat.S_ISREG(os.stat(path).st_mode) or os.stat(path).st_size > 64 << 20:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def profile_wires(profile_text):
    """(wire, nvfp4_2d, mx_rounding) of each group's profile settings: what wire="from_group" takes.
    Parsed after create, which validated the profile."""
    groups = {} if profile_text is None else json.loads(profile_text).get("groups", {})
    wires = {}
    for name, profile_name in _PROFILE_GROUPS.items():
        settings = groups.get(profile_name, {})
        wires[name] = (settings.get("wire_format", "bf16"), settings.get("nvfp4_blocks") == "2d",
                       settings.get("mx_rounding", "rceil"))
    return wires

"""One exception class per gtp_status_t; each carries the status and libgtp's gtp_last_error text."""
from . import _lib


class GtpError(Exception):
    """A libgtp call failed. `status` is the gtp_status_t value, `status_name` its name, `message` the
    text of gtp_last_error (names the call, the bad value and the fix)."""

    status = None

    def __init__(self, status, status_name, message):
        super().__init__(f"{status_name}: {message}")
        self.status = status
        self.status_name = status_name
        self.message = message


class InvalidArgumentError(GtpError, ValueError):
    """GTP_ERROR_INVALID_ARGUMENT: a bad value (NULL, size, shape, unknown enum, a weight listed twice)."""


class InvalidStateError(GtpError, RuntimeError):
    """GTP_ERROR_INVALID_STATE: call order or handle lifetime misuse (release without materialize, ...)."""


class TimeoutError(GtpError, TimeoutError):  # noqa: A001 - also a builtin TimeoutError
    """GTP_ERROR_TIMEOUT: a peer did not take part within timeout_ms."""


class SystemError(GtpError, OSError):  # noqa: A001
    """GTP_ERROR_SYSTEM: the environment failed (transport, memory budget, a dead peer)."""


class CudaError(GtpError, RuntimeError):
    """GTP_ERROR_CUDA: a CUDA or NCCL failure, or CUDA unavailable in this libgtp."""


class VersionError(GtpError, RuntimeError):
    """GTP_ERROR_VERSION: the header version this package passes differs from the library's."""


class InternalError(GtpError, RuntimeError):
    """GTP_ERROR_INTERNAL: a bug in libgtp."""


class DivergedError(GtpError, RuntimeError):
    """GTP_ERROR_DIVERGED: the ranks of a group disagree (configuration, weights, call order); every
    rank of the group raises it with the same message. Destroy the context."""


BY_STATUS = {
    _lib.ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    _lib.ERROR_INVALID_STATE: InvalidStateError,
    _lib.ERROR_TIMEOUT: TimeoutError,
    _lib.ERROR_SYSTEM: SystemError,
    _lib.ERROR_CUDA: CudaError,
    _lib.ERROR_VERSION: VersionError,
    _lib.ERROR_INTERNAL: InternalError,
    _lib.ERROR_DIVERGED: DivergedError,
}


def check(status, ctx_handle):
    """Raises the class of `status` with gtp_last_error(ctx_handle) (None: the thread's context-free text)."""
    if status == _lib.SUCCESS:
        return
    lib = _lib.lib()
    name = lib.gtp_status_string(status).decode()
    message = (lib.gtp_last_error(ctx_handle) or b"").decode(errors="replace")
    raise BY_STATUS.get(status, InternalError)(status, name, message)

"""The bootstrap vtable of comm/bootstrap_callbacks.h over any key-value store with set/get.

A store needs `set(key: str, value: bytes)` and `get(key: str) -> bytes`, where get blocks until the
key exists (torch.distributed.Store semantics) and raises when it gives up; an optional
`wait(keys, timeout_s)` bounds the wait by libgtp's timeout. Every rank must create its contexts
in the same order on the same store: the keys are numbered per (store prefix, context, collective).
"""
import ctypes
import os
import time

from . import _lib


class KVBootstrap:
    """Implements allgather / broadcast / barrier of bytes with store keys. Keeps its ctypes callback
    objects alive as long as it lives (the Context holds it)."""

    def __init__(self, store, rank, world_size, prefix):
        if not (0 <= rank < world_size):
            raise ValueError(f"rank={rank} is outside [0, world_size={world_size}); pass this process's rank")
        self.store, self.rank, self.world_size, self.prefix = store, rank, world_size, prefix
        self._sequence = 0
        self._error = ctypes.create_string_buffer(b"", 1)
        # The CFUNCTYPE objects must outlive every call libgtp makes through them.
        self._allgather = _lib.ALLGATHER_FN(self._guard(self._do_allgather))
        self._broadcast = _lib.BROADCAST_FN(self._guard(self._do_broadcast))
        self._barrier = _lib.BARRIER_FN(self._guard(self._do_barrier))
        self._last_error = _lib.LAST_ERROR_FN(lambda _user: ctypes.addressof(self._error))
        self.vtable = _lib.gtp_bootstrap_callbacks_t(
            ctypes.sizeof(_lib.gtp_bootstrap_callbacks_t), _lib.BOOTSTRAP_CALLBACKS_VERSION, rank, world_size, None,
            self._allgather, self._broadcast, self._barrier, self._last_error)

    def _guard(self, body):
        def call(_user, *args):
            try:
                body(*args)
                return _lib.BOOTSTRAP_OK
            except BaseException as e:  # noqa: BLE001 - nothing may unwind through C
                text = f"{type(e).__name__} from the key-value store {type(self.store).__name__}: {e}"
                self._error = ctypes.create_string_buffer(text.encode(errors="replace"))
                timed_out = isinstance(e, TimeoutError) or "timeout" in str(e).lower() or "timed out" in str(e).lower()
                return _lib.BOOTSTRAP_TIMEOUT if timed_out else _lib.BOOTSTRAP_ERROR
        return call

    def _key(self, operation, rank):
        return f"{self.prefix}/{self._sequence}/{operation}/{rank}"

    def _get(self, key, timeout_ms):
        wait = getattr(self.store, "wait", None)
        if wait is not None:
            wait([key], timeout_ms / 1000.0)
        value = self.store.get(key)
        return value.encode() if isinstance(value, str) else bytes(value)

    def _do_allgather(self, send, recv, bytes_per_rank, timeout_ms):
        self._sequence += 1
        self.store.set(self._key("allgather", self.rank), ctypes.string_at(send, bytes_per_rank))
        for r in range(self.world_size):
            value = self._get(self._key("allgather", r), timeout_ms)
            if len(value) != bytes_per_rank:
                raise ValueError(f"rank {r} sent {len(value)} bytes to allgather, this rank {bytes_per_rank}")
            ctypes.memmove(recv + r * bytes_per_rank, value, bytes_per_rank)

    def _do_broadcast(self, buffer, nbytes, root, timeout_ms):
        self._sequence += 1
        if self.rank == root:
            self.store.set(self._key("broadcast", root), ctypes.string_at(buffer, nbytes))
            return
        value = self._get(self._key("broadcast", root), timeout_ms)
        if len(value) != nbytes:
            raise ValueError(f"root {root} broadcast {len(value)} bytes, this rank expects {nbytes}")
        ctypes.memmove(buffer, value, nbytes)

    def _do_barrier(self, timeout_ms):
        self._sequence += 1
        self.store.set(self._key("barrier", self.rank), b"1")
        for r in range(self.world_size):
            self._get(self._key("barrier", r), timeout_ms)


class FileStore:
    """A key-value store in a shared folder (one file per key), for processes of one machine without a
    framework. get polls until the key exists or `timeout_s` passes (builtin TimeoutError)."""

    def __init__(self, folder, timeout_s=60.0):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.timeout_s = folder, timeout_s

    def _path(self, key):
        return os.path.join(self.folder, key.replace("/", "%"))

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        path = self._path(key)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as f:
            f.write(value)
        os.replace(temporary, path)  # readers see the whole value or nothing

    def wait(self, keys, timeout_s=None):
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for key in keys:
            while not os.path.exists(self._path(key)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"key '{key}' did not appear in {self.folder} in time")
                time.sleep(0.002)

    def get(self, key):
        self.wait([key])
        with open(self._path(key), "rb") as f:
            return f.read()

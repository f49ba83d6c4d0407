"""HostTimer: the host time of calls into GTP code, summed per call name (issue 41 parts 2 and 4)."""
import time


class HostTimer:
    """Wraps callables on objects (instance attributes shadow the class's methods) and sums their
    time.perf_counter time per name."""

    def __init__(self):
        self.seconds, self.calls, self._wrapped = {}, {}, []

    def wrap(self, obj, name, label=None):
        label = label or name
        inner = getattr(obj, name)
        self.seconds.setdefault(label, 0.0)
        self.calls.setdefault(label, 0)

        def timed_call(*a, **kw):
            start = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
        setattr(obj, name, timed_call)
        self._wrapped.append((obj, name))

    def unwrap(self):
        for obj, name in self._wrapped:
            delattr(obj, name)
        self._wrapped.clear()

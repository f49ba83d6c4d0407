"""CountingLibraryDouble: a test double, named so, standing in for a gtp.Context's ctypes library object.
It forwards every call to the real libgtp and counts the gtp_* calls by name, so a test sees which
calls reached libgtp (none at all on the inert G = 1 path)."""
import collections


class CountingLibraryDouble:
    def __init__(self, library):
        self._library = library
        self.calls = collections.Counter()

    def __getattr__(self, name):
        function = getattr(self._library, name)
        if not name.startswith("gtp_"):
            return function

        def counted(*args):
            self.calls[name] += 1
            return function(*args)
        return counted

    def total(self):
        return sum(self.calls.values())


def count_library_calls(context):
    """Puts a CountingLibraryDouble between `context` (a gtp.Context) and libgtp; returns the double."""
    double = CountingLibraryDouble(context._lib)
    context._lib = double
    return double

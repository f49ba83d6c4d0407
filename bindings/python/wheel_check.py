"""Checks for wheel_test.sh (each exits non-zero with the reason when a check fails).

    wheel_check.py inspect WHEEL LIBRARY VERSION   # the layout of PEP 427, RECORD's hashes, METADATA
    wheel_check.py smoke VENV VERSION TORCH [LIBRARY]  # in the venv: gtp from the wheel, one rank end to end

`smoke` runs with `python -I` from outside the checkout, so `gtp` can only come from the venv. With
LIBRARY it expects $GTP_LIBRARY to be honoured instead of the bundled library. TORCH is 1 when the
venv's python imports torch (then gtp.torch must work too), 0 when it has no torch.
"""
import base64
import hashlib
import os
import sys
import tempfile
import zipfile


def fail(message):
    sys.exit(f"FAIL: {message}")


def inspect(wheel, library, version):
    dist_info = f"libgtp-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if names[-1] != f"{dist_info}/RECORD":
            fail(f"RECORD is not the last entry: {names[-1]}")
        for info in z.infolist():
            if info.date_time != (1980, 1, 1, 0, 0, 0):
                fail(f"{info.filename} has the timestamp {info.date_time}, not the fixed one")
        record = z.read(f"{dist_info}/RECORD").decode().splitlines()
        listed = {}
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            listed[name] = (digest, size)
        if set(listed) != set(names):
            fail(f"RECORD lists {sorted(set(listed) ^ set(names))} differently from the archive")
        for name in names:
            if name == f"{dist_info}/RECORD":
                if listed[name] != ("", ""):
                    fail("RECORD must list itself without a hash")
                continue
            data = z.read(name)
            expect = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if listed[name] != (expect, str(len(data))):
                fail(f"RECORD's entry for {name} is {listed[name]}, the file is {expect},{len(data)}")
        for needed in ("gtp/__init__.py", "gtp/_lib.py", "gtp/torch/__init__.py", "gtp/torch/linear.py",
                       "gtp/megatron/__init__.py", "gtp/megatron/backend.py",
                       "gtp/libgtp.so", f"{dist_info}/METADATA", f"{dist_info}/WHEEL"):
            if needed not in names:
                fail(f"the wheel lacks {needed}")
        if z.read("gtp/libgtp.so") != open(library, "rb").read():
            fail("gtp/libgtp.so in the wheel differs from the built libgtp.so")
        if (z.getinfo("gtp/libgtp.so").external_attr >> 16) & 0o111 == 0:
            fail("gtp/libgtp.so is not executable in the wheel")
        wheel_meta = z.read(f"{dist_info}/WHEEL").decode().splitlines()
        for line in ("Wheel-Version: 1.0", "Root-Is-Purelib: false", "Tag: py3-none-linux_x86_64"):
            if line not in wheel_meta:
                fail(f"WHEEL lacks '{line}': {wheel_meta}")
        meta = z.read(f"{dist_info}/METADATA").decode().split("\n\n")[0].splitlines()
        for line in ("Name: libgtp", f"Version: {version}", "Requires-Dist: numpy", "Provides-Extra: torch",
                     'Requires-Dist: torch; extra == "torch"'):
            if line not in meta:
                fail(f"METADATA lacks '{line}': {meta}")
    print(f"inspect: {os.path.basename(wheel)}: {len(names)} files, RECORD hashes match, METADATA and WHEEL right")


def smoke(venv, version, with_torch, override=None):
    import importlib.metadata
    import numpy as np
    if with_torch == "1":
        # Before libgtp.so loads: it would bring the toolkit's older libnccl.so.2, and torch's own
        # NCCL (a newer libnccl.so.2) would then fail to bind (docs/python.md, Installing).
        import torch
        import gtp.torch as gt
    import gtp

    venv = os.path.realpath(venv)
    package = os.path.dirname(os.path.realpath(gtp.__file__))
    if not package.startswith(venv + os.sep):
        fail(f"gtp was imported from {package}, not from the venv {venv}")
    expected_library = os.path.realpath(override) if override else os.path.join(package, "libgtp.so")
    if os.path.realpath(gtp.library_path()) != expected_library:
        fail(f"gtp.library_path() is {gtp.library_path()}, expected {expected_library}")
    if importlib.metadata.version("libgtp") != version or gtp.__version__ != version:
        fail(f"installed version {importlib.metadata.version('libgtp')}, gtp.__version__ {gtp.__version__}, "
             f"gtp.h {version}")
    requires = sorted(importlib.metadata.requires("libgtp"))
    if requires != ["numpy", 'torch; extra == "torch"']:
        fail(f"installed requirements are {requires}")

    # One rank on the host backend: register, materialize, compare bytes, finalize, drain.
    rows, cols = 40, 64
    full = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    wgrad = np.random.default_rng(4).standard_normal((rows, cols)).astype(np.float32)
    ready = []
    with tempfile.TemporaryDirectory() as tmp:
        with gtp.Context(gtp.FileStore(os.path.join(tmp, "store")), 0, 1, grad_ready=ready.append) as ctx:
            main_grad = np.zeros_like(full)
            w = ctx.register("w", full.copy(), rows, cols, main_grad=main_grad)
            ctx.shard_updated([w])
            [a] = ctx.materialize_arrays([w])
            if not np.array_equal(a, gtp.float32_to_bf16_bits(full)):
                fail("the materialized BF16 weight differs from the shard's BF16 bits")
            ctx.release([w])
            ctx.grad_buffer_array(w)[:] += wgrad
            ctx.finalize([w])
            ctx.drain()
            if not np.array_equal(main_grad, wgrad) or len(ready) != 1:
                fail(f"one rank: main_grad should equal the wgrad and grad_ready fire once (fired {len(ready)})")
    print(f"smoke: gtp {gtp.__version__} from {package}, library {gtp.library_path()}: one rank round trip, "
          "finalize and drain right")

    if with_torch != "1":
        print("smoke: SKIPPED import gtp.torch: the venv's python has no torch")
        return
    if not os.path.realpath(gt.__file__).startswith(package + os.sep):
        fail(f"gtp.torch came from {gt.__file__}")
    with tempfile.TemporaryDirectory() as tmp:
        # The machinery at one rank (the default there is inert: no libgtp call to check).
        ctx = gt.Context(gtp.FileStore(os.path.join(tmp, "store")), 0, 1, backend="host", machinery_at_g1=True)
        try:
            torch.manual_seed(0)
            sharded = gt.Linear(64, 40, context=ctx)
            torch.manual_seed(0)
            plain = gt.Linear(64, 40)
            x = torch.randn(8, 64)
            y_sharded, y_plain = sharded(x), plain(x)
            if not torch.equal(y_sharded, y_plain):
                fail("gtp.torch.Linear at one rank differs from GTP off")
            y_sharded.square().sum().backward()  # auto_drain moves the shard's main grad into .grad
            y_plain.square().sum().backward()
            if not torch.allclose(sharded.weight.grad, plain.weight.grad, rtol=1e-6, atol=1e-6):
                fail("gtp.torch.Linear's shard gradient at one rank differs from GTP off's")
        finally:
            ctx.close()
    print(f"smoke: gtp.torch (torch {torch.__version__}) from the wheel: Linear at one rank equals GTP off (output, gradient)")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "inspect":
        inspect(*sys.argv[2:])
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "smoke":
        smoke(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

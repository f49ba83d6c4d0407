"""Builds the libgtp wheel (PEP 427) with the standard library only, so the build stays offline.

    build_wheel.py --header gtp.h --library libgtp.so --strip PREFIX --out DIR FILE...

Each FILE is a Python file of the package; its name in the wheel is its path without PREFIX
(bindings/python/gtp/context.py -> gtp/context.py). libgtp.so goes in as gtp/libgtp.so, where
gtp._lib looks first after $GTP_LIBRARY. The version is gtp.h's GTP_VERSION_*; the package's own
VERSION_* (gtp/_lib.py) must agree, else the build fails. The wheel is reproducible: entries sorted,
fixed timestamps and permissions, so equal inputs give equal bytes (docs/python.md, The wheel).
"""
import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

DIST = "libgtp"
TAG = "py3-none-linux_x86_64"  # pure-Python code plus one x86-64 Linux shared library, any CPython 3
# ZIP's earliest date: no build time in the bytes.
EPOCH = (1980, 1, 1, 0, 0, 0)
SUMMARY = "libgtp: Generalized Tensor Parallelism runtime (C ABI, ctypes bindings, gtp.torch)"
REQUIRES = ["numpy"]
EXTRAS = {"torch": ["torch"]}


def header_version(header):
    text = open(header, encoding="utf-8").read()
    parts = [re.search(r"^#define GTP_VERSION_%s (\d+)$" % p, text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        sys.exit(f"build_wheel.py: {header} has no GTP_VERSION_MAJOR/MINOR/PATCH")
    return ".".join(m.group(1) for m in parts)


def package_version(lib_py):
    m = re.search(r"^VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = (\d+), (\d+), (\d+)$",
                  open(lib_py, encoding="utf-8").read(), re.M)
    if not m:
        sys.exit(f"build_wheel.py: {lib_py} has no 'VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = ...' line")
    return ".".join(m.groups())


def metadata(version):
    lines = ["Metadata-Version: 2.1", f"Name: {DIST}", f"Version: {version}", f"Summary: {SUMMARY}",
             "Requires-Python: >=3.9", "Platform: linux_x86_64"]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    for extra, reqs in EXTRAS.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines += ["Description-Content-Type: text/markdown", "",
              "Python bindings of libgtp (`import gtp`, `import gtp.torch`) with `libgtp.so` inside the package.",
              "See docs/python.md of the libgtp repository."]
    return "\n".join(lines) + "\n"


def wheel_file():
    return "\n".join(["Wheel-Version: 1.0", "Generator: libgtp bindings/python/build_wheel.py",
                      "Root-Is-Purelib: false", f"Tag: {TAG}"]) + "\n"  # platlib: it holds a .so


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(path, dist_info, entries):
    """entries: {archive name: (bytes, mode)}; RECORD is added last, as PEP 427 recommends."""
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, (data, _) in sorted(entries.items()))
    record += f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, (data, mode) in sorted(entries.items()) + [(f"{dist_info}/RECORD", (record.encode(), 0o644))]:
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.create_system = 3  # Unix, so external_attr carries the permission bits
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data, compresslevel=9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--header", required=True, help="bindings/c/include/gtp/gtp.h (the version)")
    parser.add_argument("--library", required=True, help="libgtp.so, bundled as gtp/libgtp.so")
    parser.add_argument("--strip", required=True, help="prefix removed from each FILE's path")
    parser.add_argument("--out", required=True, help="folder that receives the .whl")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    version = header_version(args.header)
    entries = {}
    prefix = args.strip.rstrip("/") + "/"
    for f in args.files:
        if not f.startswith(prefix) or not f.endswith(".py"):
            sys.exit(f"build_wheel.py: {f} is not a .py file under {prefix}")
        entries[f[len(prefix):]] = (open(f, "rb").read(), 0o644)
    if "gtp/_lib.py" not in entries:
        sys.exit("build_wheel.py: the files lack gtp/_lib.py")
    lib_py_version = package_version(prefix + "gtp/_lib.py")
    if lib_py_version != version:
        sys.exit(f"build_wheel.py: gtp/_lib.py says {lib_py_version} but {args.header} says {version}; "
                 "update VERSION_* in gtp/_lib.py with the header")
    entries["gtp/libgtp.so"] = (open(args.library, "rb").read(), 0o755)
    dist_info = f"{DIST}-{version}.dist-info"
    entries[f"{dist_info}/METADATA"] = (metadata(version).encode(), 0o644)
    entries[f"{dist_info}/WHEEL"] = (wheel_file().encode(), 0o644)
    entries[f"{dist_info}/top_level.txt"] = (b"gtp\n", 0o644)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{DIST}-{version}-{TAG}.whl")
    write_wheel(path, dist_info, entries)
    print(f"build_wheel.py: wrote {path} ({len(entries) + 1} files)")


if __name__ == "__main__":
    main()

"""cuda_library: compiles .cu files with the toolkit's nvcc and wraps the objects in a cc_library.

Machine code for Hopper (sm_90) and Blackwell (sm_100) plus compute_100 PTX for newer parts; -O3;
cudart is linked statically so the binaries run anywhere the driver is installed.
"""

CUDA_ROOT = "/usr/local/cuda"

CUDA_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode=arch=compute_100,code=compute_100",
]

def cuda_library(name, srcs, hdrs = [], private_hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    """srcs: .cu files. hdrs/private_hdrs: headers they include (from this workspace).

    Headers of deps that a .cu includes must be listed in private_hdrs too, because nvcc runs in a
    genrule that sees only the files it is given.
    """
    objs = []
    for src in srcs:
        obj = "_%s_%s.pic.o" % (name, src.replace("/", "_").rsplit(".", 1)[0])
        native.genrule(
            name = obj.replace(".", "_") + "_nvcc",
            srcs = [src] + hdrs + private_hdrs,
            outs = [obj],
            cmd = " ".join([
                CUDA_ROOT + "/bin/nvcc",
                "-O3 -std=c++17 -Xcompiler=-fPIC,-Wall -lineinfo",
                "--expt-relaxed-constexpr",
                " ".join(CUDA_GENCODE),
                "-I. -I$(GENDIR)",
                " ".join(nvcc_flags),
                "-c $(location %s) -o $@" % src,
            ]),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart_static"],
        alwayslink = True,
        **kwargs
    )

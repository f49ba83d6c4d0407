"""gtp_wheel: the libgtp wheel as a folder `dist/` holding libgtp-<version>-py3-none-linux_x86_64.whl.

A folder (tree artifact) because the file name carries gtp.h's version, which Bazel cannot read
while it plans the build; the builder reads it. Built by build_wheel.py with python3 from PATH
(standard library only, offline).
"""

def _gtp_wheel_impl(ctx):
    out = ctx.actions.declare_directory("dist")
    files = ctx.files.srcs
    strip = ctx.attr.strip
    args = ctx.actions.args()
    args.add(ctx.file._builder)
    args.add("--header", ctx.file.header)
    args.add("--library", ctx.file.library)
    args.add("--strip", strip)
    args.add("--out", out.path)
    args.add_all(files)
    ctx.actions.run_shell(
        command = 'python3 "$@"',
        arguments = [args],
        inputs = files + [ctx.file._builder, ctx.file.header, ctx.file.library],
        outputs = [out],
        mnemonic = "GtpWheel",
        progress_message = "Building the libgtp wheel",
        use_default_shell_env = True,  # python3 from the user's PATH
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

gtp_wheel = rule(
    implementation = _gtp_wheel_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".py"], doc = "the package's .py files"),
        "strip": attr.string(mandatory = True, doc = "path prefix removed from srcs: bindings/python"),
        "header": attr.label(allow_single_file = [".h"], mandatory = True),
        "library": attr.label(allow_single_file = True, mandatory = True),
        "_builder": attr.label(allow_single_file = True, default = "//bindings/python:build_wheel.py"),
    },
)

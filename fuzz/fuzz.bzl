"""gtp_fuzz_test: a libFuzzer target with its seed corpus, run as a test (docs/reliability.md, Fuzzing).

Plain builds link the target with replay_main.cc and the test replays the seed corpus once (a
regression test, part of `bazel test //...`). Under `--config=fuzz` (clang, ASan + UBSan) the target
links libFuzzer and the test fuzzes from the seeds for `seconds` (GTP_FUZZ_SECONDS overrides it).
"""

def gtp_fuzz_test(name, srcs, deps = [], data = [], seconds = 20):
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = srcs,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.sh_test(
        name = name,
        size = "medium",
        srcs = ["//fuzz:run_fuzz_target.sh"],
        args = ["$(location :%s_bin)" % name, "fuzz/corpus/" + name, str(seconds)],
        data = [":%s_bin" % name] + native.glob(["corpus/%s/*" % name]) + data,
        tags = ["fuzz"],
    )

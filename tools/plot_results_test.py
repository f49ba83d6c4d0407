#!/usr/bin/env python3
"""Checks tools/plot_results.py on the committed bench/results JSON (argv[1]: the script, argv[2]: the
results folder): every PNG written, non-trivial, at the script's size; a JSON lacking a field gives a
message naming the file and the field. Writes one JUnit case per check to $XML_OUTPUT_FILE (so
tools/test_summary.py counts them); every case is skipped, with the reason printed, when matplotlib is
not importable."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SCRIPT, RESULTS = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(SCRIPT))
import plot_results  # noqa: E402  (for PLOTS and the PNG size; matplotlib is imported inside main)


def run(results, out):
    return subprocess.run([sys.executable, SCRIPT, "--results", results, "--out", out],
                          capture_output=True, text=True, timeout=300)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def copy_results(name):
    folder = os.path.join(TMP, name)
    shutil.copytree(RESULTS, folder, ignore=shutil.ignore_patterns("plots"))
    return folder


def edit(folder, name, change):
    path = os.path.join(folder, name)
    with open(path) as f:
        doc = json.load(f)
    change(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def expect_error(folder, message):
    r = run(folder, os.path.join(folder, "plots"))
    assert r.returncode == 1, f"exit {r.returncode}, expected 1; stderr: {r.stderr}"
    assert message in r.stderr, f"stderr lacks {message!r}: {r.stderr}"


def test_every_plot_from_the_committed_results():
    out = os.path.join(TMP, "plots")
    r = run(RESULTS, out)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    want = (int(plot_results.WIDTH_IN * plot_results.DPI), int(plot_results.HEIGHT_IN * plot_results.DPI))
    for name in plot_results.PLOTS:
        path = os.path.join(out, name)
        assert os.path.exists(path), f"{name} not written"
        assert os.path.getsize(path) > 20000, f"{name} is only {os.path.getsize(path)} bytes"
        assert png_size(path) == want, f"{name} is {png_size(path)}, expected {want}"


def test_a_missing_commit_names_the_file_and_the_field():
    folder = copy_results("no_commit")
    edit(folder, "torch_peer_v23.json", lambda d: d.pop("commit"))
    expect_error(folder, "torch_peer_v23.json: field 'commit' is missing")


def test_a_missing_nested_field_names_the_config():
    folder = copy_results("no_ratio")
    edit(folder, "overlap_mb1_keep.json", lambda d: d["configs"][1].pop("step_ratio_vs_resident"))
    expect_error(folder, "overlap_mb1_keep.json configs[1]: field 'step_ratio_vs_resident' is missing")


def test_a_row_without_its_rate_names_the_row():
    folder = copy_results("no_percent")
    edit(folder, "kernel_bench_v24.json", lambda d: d["results"][3].pop("percent_of_copy"))
    expect_error(folder, "kernel_bench_v24.json results[3]: field 'percent_of_copy' is missing")


def test_a_file_that_is_not_json_is_named():
    folder = copy_results("not_json")
    with open(os.path.join(folder, "comm_reduce_scatter_fp32.json"), "w") as f:
        f.write('{"results": [')
    expect_error(folder, "comm_reduce_scatter_fp32.json: cannot read it as JSON")


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    suite = ET.Element("testsuite", name="plot_results_test", tests=str(len(tests)))
    failed = 0
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
        skip = None
    except ImportError as e:
        skip = f"matplotlib or numpy is not importable by {sys.executable} ({e})"
        print(f"SKIPPED: {skip}; pip install -c tools/constraints.txt matplotlib numpy")
    for name, test in tests:
        case = ET.SubElement(suite, "testcase", classname="plot_results_test", name=name)
        if skip:
            ET.SubElement(case, "skipped", message=skip)
            continue
        try:
            test()
            print(f"ok   {name}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {name}: {e}")
            ET.SubElement(case, "failure", message=str(e))
    suite.set("failures", str(failed))
    if os.environ.get("XML_OUTPUT_FILE"):
        ET.ElementTree(suite).write(os.environ["XML_OUTPUT_FILE"])
    print(f"{len(tests) - failed} passed, {failed} failed" if not skip else f"{len(tests)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

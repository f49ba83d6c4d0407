#!/usr/bin/env python3
"""Counts test cases in the JUnit XML reports Bazel wrote for the given test targets.

Usage: test_summary.py TESTLOGS TARGET... [--testlogs OTHER_TESTLOGS TARGET...]: each --testlogs
switches the directory the following targets' reports are read from (tools/test.sh reads the fuzz
configuration's reports from its own output directory)."""
import os
import sys
import re
import xml.etree.ElementTree as ET


# Characters XML 1.0 forbids even in CDATA (control characters but tab, newline, carriage return).
INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def parse_report(path):
    """A test.xml's root element. Bazel copies a test's output into it as it is, so a fuzzer echoing
    its random input can leave bytes that are not UTF-8, or control characters XML forbids: both are
    replaced before parsing, since the verdicts are in the report's elements, not in that text."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    text = INVALID_XML.sub("\ufffd", text)
    text = re.sub(r"^<\?xml[^>]*\?>", "", text)  # its encoding no longer applies to a str
    return ET.fromstring(text)


def main() -> int:
    testlogs, args = sys.argv[1], sys.argv[2:]
    passed = failed = skipped = 0
    missing = []
    while args:
        target, args = args[0], args[1:]
        if target == "--testlogs":
            testlogs, args = args[0], args[1:]
            continue
        package, _, name = target.lstrip("/").partition(":")
        path = os.path.join(testlogs, package, name, "test.xml")
        if not os.path.exists(path):
            missing.append(target)
            continue
        try:
            root = parse_report(path)
        except ET.ParseError as error:
            print(f"{target}: its test.xml does not parse ({error}): counted as failed")
            failed += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped" \
                    or case.get("status") == "notrun":
                skipped += 1
            else:
                passed += 1
    for target in missing:
        print(f"no report for {target} (not built or not run): counted as failed")
        failed += 1
    print(f"{skipped} skipped (each printed why: no GPU here, or no hwloc fixtures beside the repository)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Counts test cases in the JUnit XML reports Bazel wrote for the given test targets.

Usage: test_summary.py TESTLOGS TARGET... [--testlogs OTHER_TESTLOGS TARGET...]: each --testlogs
switches the directory the following targets' reports are read from (tools/test.sh reads the fuzz
configuration's reports from its own output directory)."""
import os
import sys
import xml.etree.ElementTree as ET


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
        for case in ET.parse(path).getroot().iter("testcase"):
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

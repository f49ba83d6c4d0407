#!/usr/bin/env python3
"""Counts test cases in the JUnit XML reports Bazel wrote for the given test targets."""
import os
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    testlogs, targets = sys.argv[1], sys.argv[2:]
    passed = failed = skipped = 0
    missing = []
    for target in targets:
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

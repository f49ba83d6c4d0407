"""tools/test_summary.py counts a report whose output text is not UTF-8 or holds control characters
(a fuzzer echoing its input), and still counts failures; a report that does not parse at all counts
as failed instead of stopping the summary."""
import os
import subprocess
import sys
import tempfile


def report(root, target, body):
    package, name = target.lstrip("/").split(":")
    os.makedirs(os.path.join(root, package, name), exist_ok=True)
    with open(os.path.join(root, package, name, "test.xml"), "wb") as f:
        f.write(b'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite>' + body + b"</testsuite></testsuites>")


def main():
    script = sys.argv[1]
    with tempfile.TemporaryDirectory() as root:
        report(root, "//a:echo", b'<testcase name="x"><system-out><![CDATA[in \xff\xfe out \x01\x1b]]></system-out></testcase>')
        report(root, "//a:mixed", b'<testcase name="ok"/><testcase name="bad"><failure>why</failure></testcase>'
                                  b'<testcase name="skip"><skipped/></testcase>')
        report(root, "//a:broken", b"<testcase name=")
        run = subprocess.run([sys.executable, script, root, "//a:echo", "//a:mixed", "//a:broken"],
                             capture_output=True, text=True)
        lines = run.stdout.strip().splitlines()
        assert lines[-1] == "2 passed, 2 failed", run.stdout + run.stderr
        assert lines[-2].startswith("1 skipped"), run.stdout
        assert any("//a:broken" in line and "does not parse" in line for line in lines), run.stdout
        assert run.returncode == 1, run.returncode
    print("test_summary_test: ok")


if __name__ == "__main__":
    main()

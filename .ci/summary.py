"""The end of CI's output: every test that was skipped, with its reason, then one line counting
the tests of every run (`make test` in the checkout and in the fresh clone, and `make
test-pythons`'s on each other CPython), Rust's and pytest's.

Reads the runs' logs: pytest's `-rs` lines (`SKIPPED [1] tests/x.py:12: why`) and its closing
counts, cargo's `test result:` lines (an ignored test counts as skipped), and the `skipped: `
lines of tests/corpora.py, which names each Rust test it has cargo skip, and why. In
tests/pythons.py's log, a line `=== pythons: CPython 3.12.1: ...` starts each Python's run, whose
skips are labelled with that Python.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CARGO_RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", re.MULTILINE)
PYTEST_CLOSING = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s", re.MULTILINE)
PYTHONS_RUN = re.compile(r"^=== pythons: (CPython \S+):")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def main(logs: list[str]) -> None:
    passed = failed = skipped = 0
    print("=== ci: skipped, and why")
    for log in logs:
        text = Path(log).read_text(errors="replace")
        run = Path(log).stem
        for line in text.splitlines():
            started = PYTHONS_RUN.match(line)
            if started:
                run = f"{Path(log).stem} on {started[1]}"
            if line.startswith(("SKIPPED ", "skipped: ")):
                print(f"{run}: {line}")
        for ran, broke, ignored in CARGO_RESULT.findall(text):
            passed, failed, skipped = passed + int(ran), failed + int(broke), skipped + int(ignored)
        for closing in PYTEST_CLOSING.findall(text):
            for number, word in PYTEST_COUNT.findall(closing):
                if word == "passed":
                    passed += int(number)
                elif word in ("skipped", "xfailed"):
                    skipped += int(number)
                else:
                    failed += int(number)
    print(f"ci: {passed} passed, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main(sys.argv[1:])

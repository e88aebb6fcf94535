"""Every test a document names exists: each operational promise in docs/ names the test that
holds it, and a test renamed or removed would leave the promise pointing at nothing (issue 47's
rename of the ASGI scoreboard test did, in docs/ASGI.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
# A pytest test (`test_...`), as the documents name them.
NAMED_TEST = re.compile(r"\b(test_\w+)")


def _defined() -> set[str]:
    """The test functions, and the test files' names, of tests/ and bench/ (Python) and of the
    Rust crates (`fn test_...` helpers included)."""
    names: set[str] = set()
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py")]:
        names |= set(re.findall(r"def (test_\w+)", path.read_text(errors="replace")))
        names.add(path.stem)
    for path in [*ROOT.glob("crates/**/*.rs"), *ROOT.glob("fuzz/**/*.rs")]:
        names |= set(re.findall(r"fn (test_\w+)", path.read_text(errors="replace")))
    return names


def test_every_test_a_document_names_exists() -> None:
    defined = _defined()
    missing = {
        path.relative_to(ROOT).as_posix(): sorted(set(NAMED_TEST.findall(path.read_text())) - defined)
        for path in DOCUMENTS
    }
    missing = {path: names for path, names in missing.items() if names}
    assert not missing, f"documents name tests that do not exist: {missing}"

"""Autobahn|Testsuite's fuzzingclient cases 1.* to 13.*, run by kosoku (Autobahn's own case files
under Python 3), against maitred -w 2 and a bare ASGI echo application (tests/apps/websocket_echo.py).

Each case's outcome, the message exchange's and the closing handshake's, is compared with
tests/autobahn/expected.json, so that any change of outcome fails, for better or worse: a case
that improves is written into the file with the change that improved it (docs/PROTOCOL.md,
section 5, "Autobahn|Testsuite"). The outcomes of the run are written beside the test's logs,
for that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import HOST, Server

kosoku = pytest.importorskip("kosoku", reason="kosoku is in the test extra (pyproject.toml)")

APPS = Path(__file__).resolve().parent / "apps"
EXPECTED = Path(__file__).resolve().parent / "autobahn" / "expected.json"
# Autobahn has no sections 8 and 11.
CASES = [f"{section}.*" for section in (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 13)]


def test_autobahn_fuzzingclient_outcomes_are_as_expected(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    server = maitred_server("websocket_echo:app", "-w", "2", cwd=APPS)
    server.wait_for_log("serving websocket_echo:app", 30)
    try:
        results = asyncio.run(kosoku.run_fuzzingclient(f"ws://{HOST}:{server.port}", CASES))
    except kosoku.FailureError as failure:
        # Raised when any case did not pass; the expected file says which may not.
        results = failure.results
    # Each case's [behavior, behaviorClose], as Autobahn's reports name them.
    outcomes = {result.case_id: [result.behavior.value, result.behavior_close.value] for result in results}
    written = tmp_path / "autobahn-outcomes.json"
    lines = ",\n".join(f"  {json.dumps(case)}: {json.dumps(outcome)}" for case, outcome in outcomes.items())
    written.write_text(f"{{\n{lines}\n}}\n")
    expected = json.loads(EXPECTED.read_text())
    changed = {
        case: {"expected": expected.get(case), "now": outcomes.get(case)}
        for case in sorted(expected.keys() | outcomes.keys())
        if expected.get(case) != outcomes.get(case)
    }
    details = {result.case_id: f"{result.result} {result.result_close}" for result in results}
    report = "\n".join(f"{case}: {change} ({details.get(case, 'not run')})" for case, change in changed.items())
    assert not changed, f"{len(changed)} Autobahn outcomes changed (this run's are in {written}):\n{report}"

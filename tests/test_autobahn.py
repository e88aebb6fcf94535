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
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import HOST, Server

kosoku = pytest.importorskip("kosoku", reason="kosoku is in the test extra (pyproject.toml)")

APPS = Path(__file__).resolve().parent / "apps"
EXPECTED = Path(__file__).resolve().parent / "autobahn" / "expected.json"
# Autobahn has no sections 8 and 11; 12 and 13 are permessage-deflate's.
SECTIONS = ["1", "2", "3", "4", "5", "6", "7", "9", "10"]
# 12.* and 13.* echo 1,000 compressed messages a case, and kosoku's side of each (Autobahn's case
# code, in Python) costs twice the server's CPU: the whole suite takes about 4 minutes on two
# cores. CI runs, of each of their 12 groups (5 kinds of data, then 7 offers), the cases of
# messages up to 16 KiB, whole and fragmented (1 to 7, 11 and 12); MAITRED_AUTOBAHN=all runs
# every case (docs/PROTOCOL.md, section 5, "Autobahn|Testsuite").
if os.environ.get("MAITRED_AUTOBAHN") == "all":
    SECTIONS += ["12", "13"]
    COMPRESSED = []
else:
    GROUPS = [f"12.{group}" for group in range(1, 6)] + [f"13.{group}" for group in range(1, 8)]
    COMPRESSED = [f"{group}.{case}" for group in GROUPS for case in (*range(1, 8), 11, 12)]
# Cases run at once, so that kosoku's side and the server's overlap on a small machine.
CONCURRENCY = 4


def test_autobahn_fuzzingclient_outcomes_are_as_expected(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    server = maitred_server("websocket_echo:app", "-w", "2", cwd=APPS)
    server.wait_for_log("serving websocket_echo:app", 30)
    try:
        results = asyncio.run(
            kosoku.run_fuzzingclient(
                f"ws://{HOST}:{server.port}",
                [f"{section}.*" for section in SECTIONS] + COMPRESSED,
                concurrency=CONCURRENCY,
            )
        )
    except kosoku.FailureError as failure:
        # Raised when any case did not pass; the expected file says which may not.
        results = failure.results
    # Each case's [behavior, behaviorClose], as Autobahn's reports name them.
    outcomes = {result.case_id: [result.behavior.value, result.behavior_close.value] for result in results}
    written = tmp_path / "autobahn-outcomes.json"
    lines = ",\n".join(f"  {json.dumps(case)}: {json.dumps(outcome)}" for case, outcome in outcomes.items())
    written.write_text(f"{{\n{lines}\n}}\n")
    every = json.loads(EXPECTED.read_text())
    expected = {case: every[case] for case in every if case.split(".")[0] in SECTIONS or case in COMPRESSED}
    changed = {
        case: {"expected": expected.get(case), "now": outcomes.get(case)}
        for case in sorted(expected.keys() | outcomes.keys())
        if expected.get(case) != outcomes.get(case)
    }
    details = {result.case_id: f"{result.result} {result.result_close}" for result in results}
    report = "\n".join(f"{case}: {change} ({details.get(case, 'not run')})" for case, change in changed.items())
    assert not changed, f"{len(changed)} Autobahn outcomes changed (this run's are in {written}):\n{report}"

"""The workers run the Python that runs the tests, with the maitred installed beside it: the
interpreter is the one the `maitred` command's environment holds, not whichever `python3` comes
first on PATH. `make test-pythons` (tests/pythons.py) runs the worker-side tests, this one among
them, in a venv of each other CPython the machine has; there, this test shows that what they
tested ran on that CPython, with the wheel installed in that venv.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

from client import get
from test_lifecycle import APPS


def test_workers_run_the_tests_python_and_its_maitred(maitred_server):
    server = maitred_server("-w", "1", "interpreter:app", cwd=APPS)
    reply = get(server.port)
    assert reply.status == 200, reply
    seen = json.loads(reply.body)
    assert seen["version"] == list(sys.version_info[:3]), seen
    assert seen["implementation"] == sys.implementation.name, seen
    assert seen["prefix"] == sys.prefix, seen
    assert seen["free_threaded"] == bool(sysconfig.get_config_var("Py_GIL_DISABLED")), seen
    assert Path(seen["native"]).is_relative_to(sys.prefix), seen

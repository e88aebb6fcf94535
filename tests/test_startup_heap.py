"""--gc-freeze and --gc-threshold (docs/TUNING.md, "Garbage collection"): once a worker has
imported the application, what the import made is out of the cyclic garbage collector's sight,
and what requests make is collected as before; `--gc-freeze false` leaves everything to the
collector. The collector's first threshold is --gc-threshold's, unless the application's import
set its own. Real servers and requests; the application reports what the collector sees
(tests/apps/heap.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from client import get
from test_lifecycle import APPS


def what_the_collector_sees(maitred_server, *arguments: str) -> dict:
    """Starts a one-worker server with these arguments and returns its application's report."""
    server = maitred_server("-w", "1", *arguments, cwd=APPS)
    reply = get(server.port)
    assert reply.status == 200
    return json.loads(reply.body)


@pytest.mark.parametrize("app", ["heap:wsgi", "heap:asgi"], ids=["wsgi", "asgi"])
@pytest.mark.parametrize("preload", [(), ("--preload",)], ids=["", "preload"])
def test_the_import_is_frozen_and_request_garbage_is_still_collected(maitred_server, app, preload):
    seen = what_the_collector_sees(maitred_server, *preload, app)
    # The import of maitred, the standard library's pieces and the application: thousands.
    assert seen["frozen"] > 1000, seen
    assert seen["import_frozen"], seen
    assert seen["cycle_collected"], seen
    assert seen["young_threshold"] == 2000, seen


def frozen_by_the_interpreter() -> int:
    """What gc.get_freeze_count() says in a fresh interpreter of the tests' own, which the
    workers run on, after a collection, as the application's report comes after one: 0 on 3.11
    and 3.13; on 3.12 a few hundred, the immortal objects its collector moves to the permanent
    generation, gc.freeze's, when it meets them."""
    counted = subprocess.run(
        [sys.executable, "-c", "import gc; gc.collect(); print(gc.get_freeze_count())"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(counted.stdout)


@pytest.mark.parametrize("app", ["heap:wsgi", "heap:asgi"], ids=["wsgi", "asgi"])
def test_gc_freeze_false_leaves_every_object_to_the_collector(maitred_server, app):
    seen = what_the_collector_sees(maitred_server, "--gc-freeze", "false", app)
    # Not one frozen object more than the interpreter freezes by itself: a gc.freeze() of the
    # import would add thousands (the test above).
    assert seen == {
        "frozen": frozen_by_the_interpreter(),
        "import_frozen": False,
        "cycle_collected": True,
        "young_threshold": 2000,
    }


@pytest.mark.parametrize("app", ["heap:wsgi", "heap:asgi"], ids=["wsgi", "asgi"])
@pytest.mark.parametrize("preload", [(), ("--preload",)], ids=["", "preload"])
def test_gc_threshold_sizes_the_young_generation(maitred_server, app, preload):
    seen = what_the_collector_sees(maitred_server, "--gc-threshold", "900", *preload, app)
    assert seen["young_threshold"] == 900


@pytest.mark.parametrize("app", ["heap_own_threshold:wsgi", "heap_own_threshold:asgi"], ids=["wsgi", "asgi"])
@pytest.mark.parametrize("preload", [(), ("--preload",)], ids=["", "preload"])
def test_an_application_that_sets_its_own_threshold_keeps_it(maitred_server, app, preload):
    seen = what_the_collector_sees(maitred_server, *preload, app)
    assert seen["young_threshold"] == 50_000

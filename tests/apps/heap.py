"""Applications that tell what the garbage collector sees in their worker, for --gc-freeze.

Each answer is JSON: `frozen`, the objects gc.freeze() moved out of the collector's sight
(gc.get_freeze_count()); `import_frozen`, whether an object this module made at its import is
among them (gc.get_objects() leaves the frozen out); `cycle_collected`, whether a reference cycle
the request made and dropped was collected (a weak reference to it dies with the collection);
`young_threshold`, the collector's first threshold (gc.get_threshold()[0]), for --gc-threshold.
WSGI as `heap:wsgi`, ASGI as `heap:asgi`; tests/apps/heap_own_threshold.py is the same application
setting a threshold of its own at its import.
"""

import gc
import json
import weakref


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


# An object the import made, which the collector tracks (an instance always is; a dict of
# strings is not), found again by its identity.
MADE_AT_IMPORT = _Node()


def _report() -> bytes:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    watch = weakref.ref(first)
    del first, second
    gc.collect()
    import_frozen = not any(candidate is MADE_AT_IMPORT for candidate in gc.get_objects())
    return json.dumps(
        {
            "frozen": gc.get_freeze_count(),
            "import_frozen": import_frozen,
            "cycle_collected": watch() is None,
            "young_threshold": gc.get_threshold()[0],
        }
    ).encode()


def wsgi(environ, start_response):
    body = _report()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    body = _report()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})

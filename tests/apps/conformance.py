"""What every application of tests/test_asgi_frameworks.py serves, each written with its own
framework's means (conformance_*.py): the routes, their answers, and the lifespan's record.

- GET /hello: "Hello, world!" as text.
- POST /echo: the request body, as it came.
- GET /stream: `CHUNKS`, streamed one by one.
- GET /sse: `EVENTS` as Server-Sent Events, with the `Cache-Control: no-cache` and
  `Connection: keep-alive` headers that SSE endpoints send (the server drops the second: the
  connection's framing is its own).
- GET /lifespan: "started" once the lifespan's startup ran (a framework without lifespan
  support answers "no lifespan").
- WebSocket /ws: accepts with `SUBPROTOCOL` when the client offers it, echoes text and bytes,
  and closes with `CLOSE_CODE` and `CLOSE_REASON` when it receives the text "close".

The lifespan writes "startup" and "shutdown", a line each, to the file named by LIFESPAN_LOG.
"""

from __future__ import annotations

import os

HELLO = "Hello, world!"
CHUNKS = [f"chunk {n}\n" for n in range(5)]
EVENTS = ["one", "two", "three"]
SUBPROTOCOL = "echo.v1"
CLOSE_CODE = 4001
CLOSE_REASON = "bye"
SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive"}


def record(event: str) -> None:
    """Appends a lifespan event to LIFESPAN_LOG."""
    with open(os.environ["LIFESPAN_LOG"], "a") as log:
        log.write(f"{event}\n")


def sse(event: str) -> str:
    return f"data: {event}\n\n"

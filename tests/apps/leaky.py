"""An application that leaks 2 MB per request, for --max-worker-memory.

Every answer is the worker's pid followed by a newline. A worker that has leaked 256 MB
answers 500 instead of leaking more: without recycling the tests fail without taking the
machine's memory.
"""

import os

LEAK = 2 << 20
CEILING = 256 << 20
_leaked: list[bytes] = []


def app(environ, start_response):
    if len(_leaked) * LEAK >= CEILING:
        status = "500 Internal Server Error"
    else:
        # Filled with a non-zero byte, so that every page is written and resident.
        _leaked.append(b"x" * LEAK)
        status = "200 OK"
    body = f"{os.getpid()}\n".encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

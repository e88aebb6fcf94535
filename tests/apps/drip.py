"""Answers slowly, for tests of clients that leave in the middle of a response.

/drip?seconds=S       streams one line every 0.05 s for S seconds
/pid                  answers the worker's pid
"""

import os
import time
from urllib.parse import parse_qs

INTERVAL = 0.05


def app(environ, start_response):
    if environ["PATH_INFO"] != "/drip":
        body = f"{os.getpid()}\n".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    seconds = float(parse_qs(environ["QUERY_STRING"])["seconds"][0])
    start_response("200 OK", [("Content-Type", "text/plain")])
    return _lines(int(seconds / INTERVAL))


def _lines(count):
    for number in range(count):
        time.sleep(INTERVAL)
        yield f"line {number}\n".encode()

"""An application whose import takes a second: a request that waits for a new worker to
start waits about that long. Every answer is the worker's pid followed by a newline."""

import os
import time

time.sleep(1.0)


def app(environ, start_response):
    body = f"{os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

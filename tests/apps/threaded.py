"""An application for worker threads (--threads): every answer says which process and which
thread served it, and whether the environ says the worker is multithreaded.

    /who                  answers at once
    /sleep?seconds=S      sleeps S seconds first
    /spin?seconds=S       runs Python for S seconds first, holding the GIL but for its switches
    /exit?after=S         sleeps S seconds, then os._exit(1): the whole worker ends

The body is "PID THREAD-NAME MULTITHREAD\\n", so that a test can tell where each request ran.
"""

import os
import threading
import time
from urllib.parse import parse_qs


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = parse_qs(environ["QUERY_STRING"])
    if path == "/sleep":
        time.sleep(float(query["seconds"][0]))
    elif path == "/spin":
        deadline = time.monotonic() + float(query["seconds"][0])
        while time.monotonic() < deadline:
            pass
    elif path == "/exit":
        time.sleep(float(query.get("after", ["0"])[0]))
        os._exit(1)
    body = f"{os.getpid()} {threading.current_thread().name} {environ['wsgi.multithread']}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

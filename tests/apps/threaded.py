"""An application for worker threads (--threads): every answer says which process and which
thread served it, and whether the environ says the worker is multithreaded.

    /who                  answers at once
    /sleep?seconds=S      sleeps S seconds first (with &entered=PATH: writes its pid to PATH
                          once in the application, before the sleep)
    /spin?seconds=S       runs Python for S seconds first, holding the GIL but for its switches
    /exit?after=S         sleeps S seconds, then os._exit(1): the whole worker ends

The body is "PID THREAD-NAME MULTITHREAD IN-APP\\n", so that a test can tell where each request
ran, and with how many others at once: IN-APP counts the requests in the application when it
came, itself included.
"""

import os
import threading
import time
from urllib.parse import parse_qs

_in_app = 0
_counting = threading.Lock()


def app(environ, start_response):
    global _in_app
    with _counting:
        _in_app += 1
        in_app = _in_app
    try:
        return _answer(environ, start_response, in_app)
    finally:
        with _counting:
            _in_app -= 1


def _answer(environ, start_response, in_app):
    path = environ["PATH_INFO"]
    query = parse_qs(environ["QUERY_STRING"])
    if path == "/sleep":
        if "entered" in query:
            with open(query["entered"][0], "w") as entered:
                entered.write(str(os.getpid()))
        time.sleep(float(query["seconds"][0]))
    elif path == "/spin":
        deadline = time.monotonic() + float(query["seconds"][0])
        while time.monotonic() < deadline:
            pass
    elif path == "/exit":
        time.sleep(float(query.get("after", ["0"])[0]))
        os._exit(1)
    body = f"{os.getpid()} {threading.current_thread().name} {environ['wsgi.multithread']} {in_app}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

"""An application that gets stuck, or leaves, on request, for tests/test_worker_health.py.

    /pid                  answers the worker's pid
    /stuck?main=sleep     starts a thread stuck in C (select.select on nothing), then sleeps
                          in Python (time.sleep), for a minute each
    /stuck?main=read      the same, but the request's own thread is stuck in C too: it reads
                          a pipe nobody writes to
    /sleep?seconds=S      sleeps S seconds, then answers the worker's pid
    /exit?after=S         sleeps S seconds (0 if not given), then raises SystemExit: the worker
                          answers 500, then exits
    /wedge                answers, and 0.3 s later a thread of its own says on stderr that it
                          takes the GIL, and keeps it for a minute (a C call through
                          ctypes.PyDLL, which does not let go of it): the worker is alive, idle,
                          and cannot read a request

Every answer that succeeds is the pid followed by a newline. The functions the stuck threads
are in have names of their own, for the test to find in the stack the worker writes.
"""

import ctypes
import os
import select
import sys
import threading
import time
from urllib.parse import parse_qs


def stuck_in_select() -> None:
    select.select([], [], [], 60)


def stuck_in_time_sleep() -> None:
    time.sleep(60)


def stuck_reading_a_pipe() -> None:
    reader, _writer = os.pipe()
    os.read(reader, 1)


def holding_the_gil() -> None:
    time.sleep(0.3)
    # The test waits for this thread to be in the C call's nanosleep, the GIL held.
    print(f"health: thread {threading.get_native_id()} takes the GIL", file=sys.stderr, flush=True)
    ctypes.PyDLL(None).sleep(60)


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = parse_qs(environ["QUERY_STRING"])
    if path == "/stuck":
        threading.Thread(target=stuck_in_select, daemon=True).start()
        if query["main"][0] == "sleep":
            stuck_in_time_sleep()
        else:
            stuck_reading_a_pipe()
    elif path == "/wedge":
        threading.Thread(target=holding_the_gil, daemon=True).start()
    elif path == "/sleep":
        time.sleep(float(query["seconds"][0]))
    elif path == "/exit":
        time.sleep(float(query.get("after", ["0"])[0]))
        raise SystemExit(3)
    body = f"{os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

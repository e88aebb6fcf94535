"""An application that ends its worker in each way a real one can, on request.

    /pid                  answers the worker's pid
    /sleep?seconds=S      sleeps S seconds, then answers the worker's pid
    /exit?after=S         sleeps S seconds, then os._exit(1)
    /sigkill?after=S      sleeps S seconds, then SIGKILL to itself
    /segfault?after=S     sleeps S seconds, then reads address 0
    /raise                an exception escapes the application
    /hog                  takes memory, 4 MiB every 20 ms, until the kernel's OOM killer ends
                          it: only under a memory cgroup's limit (tests/test_worker_kills.py);
                          at 1 GiB it raises MemoryError (a 500) instead, so that no test takes
                          the machine's memory

Every answer is the pid followed by a newline, so a test can tell which worker served it.
"""

import ctypes
import os
import resource
import signal
import time
from urllib.parse import parse_qs

# A segfault must not leave a core file in the tests' tree.
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _die_by_exit() -> None:
    os._exit(1)


def _die_by_sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_by_segfault() -> None:
    ctypes.string_at(0)


HOG_STEP = 4 << 20
HOG_CEILING = 1 << 30
_hogged: list[bytes] = []


def _die_by_oom_kill() -> None:
    while len(_hogged) * HOG_STEP < HOG_CEILING:
        # Filled with a non-zero byte, so that every page is written and resident.
        _hogged.append(b"x" * HOG_STEP)
        time.sleep(0.02)
    raise MemoryError(f"crashy.py took {HOG_CEILING >> 20} MiB and was not killed: no memory limit?")


DEATHS = {
    "/exit": _die_by_exit,
    "/sigkill": _die_by_sigkill,
    "/segfault": _die_by_segfault,
    "/hog": _die_by_oom_kill,
}


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = parse_qs(environ["QUERY_STRING"])
    if path == "/sleep":
        time.sleep(float(query["seconds"][0]))
    elif path in DEATHS:
        time.sleep(float(query.get("after", ["0"])[0]))
        DEATHS[path]()
    elif path == "/raise":
        raise RuntimeError("raised on purpose by crashy.py")
    body = f"{os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]

"""The WSGI applications the benchmark serves: plain WSGI, no framework, the same for every server.

Run from this directory (the harness puts it on PYTHONPATH), e.g. ``gunicorn apps:hello``.
"""

import os
import time

HELLO_BODY = b"Hello world\n"  # 12 bytes, the same fixed body nginx serves as the ceiling.
_HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(HELLO_BODY)))]


def hello(environ, start_response):
    """The smallest useful response: measures the server, not the application."""
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]


def sleep_1ms(environ, start_response):
    """An application that holds its worker for 1 ms, like a fast database query (scenario S1)."""
    time.sleep(0.001)
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]


# O1's cost per request: enough CPU that 2 workers on this machine serve a few hundred requests a
# second, so that overload is reached by a client that is far from its own limit.
CPU_SECONDS_PER_REQUEST = 0.003


def cpu_3ms(environ, start_response):
    """An application that computes for 3 ms, like rendering a page (scenario O1). It spins on its
    own thread's CPU clock rather than sleeping, so that it holds the CPU as real work does; the
    thread's clock, not the process's, so that a threaded server's other threads (its I/O, other
    requests) do not shorten it."""
    done_at = time.thread_time() + CPU_SECONDS_PER_REQUEST
    while time.thread_time() < done_at:
        pass
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]


# O1-HAPROXY: the variable naming the file cpu_3ms_counted counts the requests it ran in.
RAN_FILE_VARIABLE = "BENCH_RAN_FILE"


def cpu_3ms_counted(environ, start_response):
    """cpu_3ms, counting each request it runs first (O1-HAPROXY: were the requests the proxy gave up
    on run all the same?): one byte appended to the file RAN_FILE_VARIABLE names, whose length is
    then the count. An append is one write at the file's end whoever else appends, so the workers
    and their threads need no lock."""
    counter = os.open(os.environ[RAN_FILE_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(counter, b".")
    finally:
        os.close(counter)
    return cpu_3ms(environ, start_response)


# IO1's wait per request: a database or an HTTP API answering in 20 ms, during which the request's
# thread holds no CPU and no GIL, so that 2 workers x 4 threads can serve 8 of them at once.
IO_WAIT_SECONDS = 0.02


def io_20ms(environ, start_response):
    """An application that waits 20 ms for I/O, then answers with the small body (IO1, IO1-mem)."""
    time.sleep(IO_WAIT_SECONDS)
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]


# HOL's slow request: a report or an export that holds its thread for 2 s.
SLOW_PATH = "/slow"
SLOW_SECONDS = 2.0


def slow_2s_or_quick(environ, start_response):
    """GET /slow waits 2 s before answering; any other path answers at once (scenario HOL), so that
    the readiness check, GET /, is a quick request."""
    if environ["PATH_INFO"] == SLOW_PATH:
        time.sleep(SLOW_SECONDS)
    start_response("200 OK", _HEADERS)
    return [HELLO_BODY]
